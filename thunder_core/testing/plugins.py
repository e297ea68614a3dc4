"""Test helpers for plugin packages: the status of an installed plugin, loaded as a job would."""

from __future__ import annotations

from thunder_core.plugins.manager import PluginInfo, plugin_manager


def plugin_info(name: str) -> PluginInfo:
    """Discover, probe and load the plugin ``name``; its ``status``, ``reason``, ``remedy``, ``executors``."""
    manager = plugin_manager()
    if name not in manager.plugins:
        raise KeyError(f"no installed plugin named {name!r}; installed: {manager.names()}")
    return manager.load(manager.plugins[name])


def check_probe_against_machine(name: str, modules: list[str], not_installed: str) -> None:
    """Assert a GPU executor's probe agrees with an independent look at this machine.

    Written without the probe's code: is one of ``modules`` findable, is there a CUDA device.
    Available implies both; a missing library or device makes it unavailable with that reason.
    """
    import importlib.util

    import torch

    library = any(importlib.util.find_spec(m) is not None for m in modules)
    gpu = torch.cuda.is_available()
    info = plugin_info(name)
    if info.status == "available":
        assert library and gpu, (library, gpu)
    if not library:
        assert info.status == "unavailable" and not_installed in info.reason, info.reason
    if not gpu:
        assert info.status == "unavailable"
        expected = "CPU-only build" if torch.version.cuda is None else "no CUDA device"
        assert expected in info.reason, info.reason
