"""thunder-executor-cudnn: the light module thunder-core imports to probe it."""

from __future__ import annotations

from thunder_core.extend import availability, cuda_device, library
from thunder_core.plugins import Availability, hookimpl

MIN_CAPABILITY = (8, 0)
REMEDY = (
    "pip install 'thunder-executor-cudnn[cudnn]' on a machine with an NVIDIA GPU of compute capability 8.0+"
)


def problems() -> list[str]:
    found = [library("cudnn", "nvidia-cudnn-frontend", ">=1.5"), cuda_device(MIN_CAPABILITY)]
    return [p for p in found if p]


@hookimpl
def thunder_core_probe() -> Availability:
    return availability(problems(), REMEDY)


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_cudnn._impl import build_executor

    register(build_executor())
