"""Errors of the plugin system."""

from __future__ import annotations

from thunder_core.errors import ThunderCoreError


class PluginError(ThunderCoreError):
    """A plugin that was asked for cannot be used; the message is its stored reason."""


class ConfigError(ThunderCoreError, ValueError):
    """A wrong key, name or value in the API, the environment or a config file."""
