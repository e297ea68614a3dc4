"""thunder-executor-cupy: the light module thunder-core imports to probe it."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from thunder_core.extend import availability, cuda_device
from thunder_core.plugins import Availability, hookimpl

REMEDY = "pip install 'thunder-executor-cupy[cuda12]' (CuPy for CUDA 12) on a machine with an NVIDIA GPU"


def cupy_problem() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (no module 'cupy')"
    names = [
        d.metadata["Name"]
        for d in importlib.metadata.distributions()
        if (d.metadata["Name"] or "").startswith("cupy")
    ]
    if not names:
        return "a module 'cupy' is there but no CuPy distribution provides it"
    return None


def problems() -> list[str]:
    return [p for p in (cupy_problem(), cuda_device()) if p]


@hookimpl
def thunder_core_probe() -> Availability:
    return availability(problems(), REMEDY)


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("min_region_size", int, 2, "fewest operations worth a fused region")


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_cupy._impl import CupyExecutor, softmax_executor

    register(CupyExecutor())
    register(softmax_executor())
