"""The ``fsdp`` entry point: hooks only (see ``thunder_plugin_distributed.fsdp``)."""

from __future__ import annotations

from thunder_core.plugins import hookimpl
from thunder_plugin_distributed.common import probe


@hookimpl
def thunder_core_probe():
    return probe()


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare(
        "zero", int, 3, "3: gather parameters again in the backward; 2: keep them gathered from the forward"
    )
    declare(
        "broadcast", bool, True, "shard the first rank's parameters (every rank starts from the same model)"
    )


@hookimpl
def thunder_core_register_module_transform(register) -> None:
    from thunder_plugin_distributed.fsdp import fsdp_transform

    register(fsdp_transform, name="fsdp")


@hookimpl
def thunder_core_register_passes(register) -> None:
    from thunder_plugin_distributed.schedule import schedule_collectives

    register("after_executors", schedule_collectives, name="schedule collectives")
