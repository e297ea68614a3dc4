"""Testing tools for thunder_core and executor authors: OpInfo checks, the conformance kit, plugin status.

Needs the ``expecttest`` package (PyTorch's OpInfo database imports it) for the OpInfo tools.
"""

from thunder_core.testing.plugins import check_probe_against_machine, plugin_info

__all__ = ["check_probe_against_machine", "plugin_info"]
