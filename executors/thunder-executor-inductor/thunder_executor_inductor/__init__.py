"""thunder-executor-inductor: the light module thunder-core imports to probe it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess

from thunder_core.plugins import Availability, hookimpl


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _has_submodule(spec, name: str) -> bool:
    """Whether package ``spec`` has module ``name``, found without importing the package (finding
    ``torch._inductor.standalone_compile`` by name would import Inductor and Dynamo)."""
    locations = spec.submodule_search_locations
    if not locations:
        return False
    return importlib.machinery.PathFinder.find_spec(f"{spec.name}.{name}", list(locations)) is not None


@hookimpl
def thunder_core_probe() -> Availability:
    inductor = importlib.util.find_spec("torch._inductor")
    if inductor is None:
        return Availability.missing(
            "torch._inductor not found in this torch build", "pip install 'torch>=2.8'"
        )
    if not _has_submodule(inductor, "standalone_compile"):
        return Availability.missing(
            "this torch has no torch._inductor.standalone_compile (added in torch 2.8)",
            "pip install 'torch>=2.8'",
        )
    compiler = _compiler()
    if compiler is None:
        return Availability.missing(
            "no C++ compiler found (CXX, g++, c++, clang++)", "install one, e.g. apt-get install g++"
        )
    try:
        subprocess.run([compiler, "--version"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as error:
        return Availability.missing(
            f"the C++ compiler {compiler} does not run: {error}", "fix or reinstall it"
        )
    return Availability.ok()


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("min_region_size", int, 2, "fewest computing (non-view) operations worth a compiled region")
    declare(
        "regions",
        str,
        "fusion",
        '"fusion": regions between matmuls and attention (run by ATen); "maximal": those too, so '
        "Inductor sees whole stretches of the program as torch.compile would",
    )
    declare("cpp_wrapper", bool, False, "Inductor's cpp_wrapper: the generated module's call path in C++")
    declare("max_autotune", bool, False, "Inductor's max_autotune: benchmark GEMM templates while compiling")
    declare(
        "eager_rounding",
        bool,
        True,
        "float16/bfloat16 regions round every intermediate as eager's separate kernels do (Inductor's "
        "emulate_precision_casts); False: a fused chain computed in float32 and rounded once, as torch.compile does",
    )


@hookimpl
def thunder_core_register_executor(register) -> None:
    from thunder_executor_inductor._impl import InductorExecutor

    register(InductorExecutor())
