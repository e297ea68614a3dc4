"""The ``ddp`` entry point: hooks only (see ``thunder_plugin_distributed.ddp``)."""

from __future__ import annotations

from thunder_core.plugins import hookimpl
from thunder_plugin_distributed.common import probe


@hookimpl
def thunder_core_probe():
    return probe()


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare(
        "bucket_size_mb", int, 25, "gradients all-reduced together, in MiB (0: one all-reduce per gradient)"
    )
    declare("broadcast", bool, True, "give every rank the first rank's parameters and buffers at wrap time")


@hookimpl
def thunder_core_register_module_transform(register) -> None:
    from thunder_plugin_distributed.ddp import ddp_transform

    register(ddp_transform, name="ddp")


@hookimpl
def thunder_core_register_passes(register) -> None:
    from thunder_plugin_distributed.schedule import schedule_collectives

    register("after_executors", schedule_collectives, name="schedule collectives")
