"""thunder-executor-apex: the light module thunder-core imports to probe it.

The probe tells NVIDIA Apex apart from the unrelated PyPI package that is also named
``apex``: NVIDIA's has the ``apex.normalization`` subpackage (and, for the fused
cross-entropy, ``apex.contrib.xentropy``), built with its CUDA extensions.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from thunder_core.extend import availability, cuda_device
from thunder_core.plugins import Availability, hookimpl

BUILD = (
    "build NVIDIA Apex from its source repository (NVIDIA/apex) with its CUDA extensions "
    "(--cpp_ext --cuda_ext, plus --xentropy for the fused cross-entropy)"
)


def _find(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def apex_problem() -> str | None:
    """None if NVIDIA Apex is importable, else what is installed instead."""
    if not _find("apex"):
        return "NVIDIA Apex is not installed (no module 'apex')"
    if not _find("apex.normalization"):
        try:
            dist = importlib.metadata.distribution("apex")
            what = f"the PyPI package apex {dist.version} ({dist.metadata.get('Summary') or 'no summary'})"
        except importlib.metadata.PackageNotFoundError:
            what = "a module named 'apex'"
        return f"the installed 'apex' is not NVIDIA Apex: it is {what}, an unrelated project with no apex.normalization"
    if not _find("fused_layer_norm_cuda"):
        return "NVIDIA Apex is installed without its CUDA extensions (no fused_layer_norm_cuda)"
    return None


def problems() -> list[str]:
    return [p for p in (apex_problem(), cuda_device()) if p]


@hookimpl
def thunder_core_probe() -> Availability:
    return availability(problems(), BUILD + " on a machine with an NVIDIA GPU")


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_apex._impl import build_executor

    register(build_executor())
