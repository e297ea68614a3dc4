"""The ``quantize-int8`` entry point."""

from __future__ import annotations

from thunder_core.plugins import hookimpl
from thunder_plugin_quantization import plugin


@hookimpl
def thunder_core_probe():
    return plugin.probe("int8")


@hookimpl
def thunder_core_declare_options(declare) -> None:
    plugin.declare_options(declare, "int8")


@hookimpl
def thunder_core_register_module_transform(register) -> None:
    plugin.register_module_transform(register, "int8")


@hookimpl
def thunder_core_register_passes(register) -> None:
    plugin.register_passes(register)
