"""The plugin system: executors and transform plugins found through entry points, driven by pluggy.

For plugin authors::

    from thunder_core.plugins import Availability, hookimpl
"""

from thunder_core.plugins.hookspecs import STAGES, Availability, hookimpl

__all__ = ["STAGES", "Availability", "hookimpl"]
