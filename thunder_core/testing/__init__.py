"""Testing tools for thunder_core and executor authors: OpInfo checks, the conformance kit, plugin status.

Needs the ``expecttest`` package (PyTorch's OpInfo database imports it) for the OpInfo tools.
"""

from thunder_core.testing.plugins import plugin_info

__all__ = ["plugin_info"]
