"""thunder-executor-nvfuser: the light module thunder-core imports to probe it."""

from __future__ import annotations

import importlib.util

from thunder_core.extend import availability, cuda_device, library
from thunder_core.plugins import Availability, hookimpl

VERSIONS = ">=0.2"
REMEDY = "pip install the nvfuser wheel built for your CUDA and torch (e.g. nvfuser-cu128-torch27) on a GPU machine"


def nvfuser_problem() -> str | None:
    for module in ("nvfuser", "nvfuser_direct"):
        if importlib.util.find_spec(module) is not None:
            import importlib.metadata as metadata

            names = [
                d.metadata["Name"]
                for d in metadata.distributions()
                if (d.metadata["Name"] or "").startswith("nvfuser")
            ]
            return library(module, names[0], VERSIONS) if names else None
    return "nvFuser is not installed (no module 'nvfuser' or 'nvfuser_direct')"


def problems() -> list[str]:
    return [p for p in (nvfuser_problem(), cuda_device()) if p]


@hookimpl
def thunder_core_probe() -> Availability:
    return availability(problems(), REMEDY)


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("min_region_size", int, 2, "fewest operations worth a fused region")


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_nvfuser._impl import NvFuserExecutor

    register(NvFuserExecutor())
