"""Test helpers for plugin packages: the status of an installed plugin, loaded as a job would."""

from __future__ import annotations

from thunder_core.plugins.manager import PluginInfo, plugin_manager


def plugin_info(name: str) -> PluginInfo:
    """Discover, probe and load the plugin ``name``; its ``status``, ``reason``, ``remedy``, ``executors``."""
    manager = plugin_manager()
    if name not in manager.plugins:
        raise KeyError(f"no installed plugin named {name!r}; installed: {manager.names()}")
    return manager.load(manager.plugins[name])
