"""The ``dtensor`` entry point: hooks only (see ``thunder_plugin_distributed.dtensor``).

``thunder_core.jit(model)`` selects it by itself when ``model``'s parameters are DTensors."""

from __future__ import annotations

from thunder_core.plugins import hookimpl
from thunder_plugin_distributed.common import probe


@hookimpl
def thunder_core_probe():
    return probe()


@hookimpl
def thunder_core_register_module_transform(register) -> None:
    from thunder_plugin_distributed.dtensor import dtensor_transform

    register(dtensor_transform, name="dtensor")


@hookimpl
def thunder_core_register_passes(register) -> None:
    from thunder_plugin_distributed.schedule import schedule_collectives

    register("after_executors", schedule_collectives, name="schedule collectives")
