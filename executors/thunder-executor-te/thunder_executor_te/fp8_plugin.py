"""The ``fp8`` plugin: TransformerEngine's FP8 linear with the job's recipe, claiming first.

    jitted = thunder_core.jit(model, plugins=["fp8"], options={"fp8": {"format": "hybrid"}})

Selecting it adds the TE executor, named ``te_fp8``, in FP8 with a ``DelayedScaling`` recipe built
from the options, ahead of every other executor. Unavailable, with the reason, without
TransformerEngine or without a GPU of compute capability 8.9+ (FP8 tensor cores).
"""

from __future__ import annotations

from thunder_core.extend import availability, cuda_device, library
from thunder_core.plugins import Availability, hookimpl
from thunder_executor_te.recipe import declare_recipe_options, recipe_from

REMEDY = "pip install 'thunder-executor-te[te]' on a machine with an NVIDIA GPU of compute capability 8.9+ (Ada, Hopper)"


def problems() -> list:
    return [library("transformer_engine", "transformer_engine", ">=1.8"), cuda_device((8, 9))]


@hookimpl
def thunder_core_probe() -> Availability:
    return availability(problems(), REMEDY)


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare_recipe_options(declare)


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_te._impl import build_executor

    register(build_executor(fp8=True, recipe=recipe_from({}), name="te_fp8"))
