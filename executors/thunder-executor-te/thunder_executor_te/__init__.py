"""thunder-executor-te: the light module thunder-core imports to probe it."""

from __future__ import annotations

from thunder_core.extend import availability, cuda_device, library
from thunder_core.plugins import Availability, hookimpl

REMEDY = (
    "pip install 'thunder-executor-te[te]' on a machine with an NVIDIA GPU (compute capability 8.9+ for FP8)"
)


def problems() -> list[str]:
    found = [library("transformer_engine", "transformer_engine", ">=1.8"), cuda_device((8, 0))]
    return [p for p in found if p]


@hookimpl
def thunder_core_probe() -> Availability:
    return availability(problems(), REMEDY)


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("fp8", bool, True, "run the GEMMs in FP8 (DelayedScaling recipe; needs compute capability 8.9+)")


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_te._impl import build_executor

    register(build_executor())
