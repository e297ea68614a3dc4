"""thunder-executor-numba: the light module thunder-core imports to probe it.

Numba itself is imported when the executor compiles its first region (``codegen`` and ``kernels``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from thunder_core.plugins import Availability, hookimpl

NUMBA_RANGE = SpecifierSet(">=0.59")


@hookimpl
def thunder_core_probe() -> Availability:
    if importlib.util.find_spec("numba") is None:
        return Availability.missing("numba not installed", "pip install 'numba>=0.59'")
    version = importlib.metadata.version("numba")
    if Version(version) not in NUMBA_RANGE:
        return Availability.missing(f"numba {version} is outside {NUMBA_RANGE}", "pip install -U numba")
    return Availability.ok()


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("min_region_size", int, 2, "smallest number of operations worth a fused kernel")
    declare("parallel_threshold", int, 32768, "elements below which kernels run on one thread")


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_numba._impl import NumbaExecutor

    register(NumbaExecutor())
