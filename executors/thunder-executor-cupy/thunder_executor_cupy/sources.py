"""The CUDA source of each elementwise kernel, for checks that need no GPU (pure logic).

``kernel_source`` wraps an ``elementwise_kernel_spec`` body the way CuPy's ``ElementwiseKernel``
does for contiguous arrays: one thread per element, each input read at the thread's index (a
``raw`` one-element input as ``in{k}[0]``), the outputs written back. ``elementwise_regions``
finds, in a trace, the runs of operations the CuPy executor fuses into one such kernel. The
``gpu-host-checks`` nox session compiles every kernel of a litgpt training step with ``nvcc``
for sm_80 and sm_90.
"""

from __future__ import annotations

import re

from thunder_core.extend import RegionNotSupported, TensorProxy, free_inputs, leaves
from thunder_executor_cupy.codegen import ELEMENTWISE_OPS, SUPPORTED, elementwise_kernel_spec

CUDA_TYPES = {"float32": "float", "float64": "double", "float16": "__half", "bool": "bool"}
PRELUDE = "#include <cuda_fp16.h>\ntypedef __half float16;\n"


def kernel_source(name: str, in_params: str, out_params: str, operation: str) -> str:
    params, reads = [], []
    for part in [p.strip() for p in in_params.split(",") if p.strip()]:
        words = part.split()
        raw, type_name, var = (words[0] == "raw"), words[-2], words[-1]
        params.append(f"const {CUDA_TYPES[type_name]}* {var}_ptr")
        reads.append(
            f"const {CUDA_TYPES[type_name]}* {var} = {var}_ptr;"
            if raw
            else f"const {CUDA_TYPES[type_name]} {var} = {var}_ptr[i];"
        )
    writes = []
    for part in [p.strip() for p in out_params.split(",") if p.strip()]:
        type_name, var = part.split()
        params.append(f"{CUDA_TYPES[type_name]}* {var}_ptr")
        reads.append(f"{CUDA_TYPES[type_name]} {var};")
        writes.append(f"{var}_ptr[i] = {var};")
    body = "\n    ".join([*reads, *operation.splitlines(), *writes])
    signature = ", ".join([*params, "long long n"])
    return (
        f'extern "C" __global__ void {name}({signature}) {{\n'
        f"  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x) {{\n"
        f"    {body}\n  }}\n}}\n"
    )


def _fusible(bsym) -> bool:
    if bsym.symbol.is_prim:
        return bsym.symbol.name in SUPPORTED
    return bsym.symbol.name in ELEMENTWISE_OPS


def elementwise_regions(trace) -> list[tuple[list, list, list]]:
    """(operations, inputs, outputs) of each run of neighbouring fusible operations of ``trace``."""
    bsyms = trace.bound_symbols
    later = [set() for _ in range(len(bsyms) + 1)]
    later[-1] = {p.name for p in leaves(trace.output) if isinstance(p, TensorProxy)}
    for i in range(len(bsyms) - 1, -1, -1):
        later[i] = later[i + 1] | {p.name for p in bsyms[i].flat_args()}
    regions, run = [], []

    def close(end: int) -> None:
        if len(run) >= 2:
            inputs = [p for p in free_inputs(run) if isinstance(p, TensorProxy)]
            outputs = [p for b in run for p in b.flat_outputs() if p.name in later[end]]
            if outputs:
                regions.append((list(run), inputs, outputs))
        run.clear()

    for i, bsym in enumerate(bsyms):
        if bsym.symbol.name == "del":
            continue  # freeing a value does not end a run
        if _fusible(bsym):
            run.append(bsym)
        else:
            close(i)
    close(len(bsyms))
    return regions


def kernel_sources(trace) -> list[str]:
    """The CUDA source of every kernel the CuPy executor would build for ``trace``, each named
    ``thunder_region`` (``translation_unit`` gives them distinct names)."""
    sources = []
    for operations, inputs, outputs in elementwise_regions(trace):
        try:
            spec = elementwise_kernel_spec(operations, inputs, outputs)
        except RegionNotSupported:
            continue  # the executor gives such a region back to torch
        sources.append(kernel_source("thunder_region", *spec))
    return sources


def translation_unit(sources: list[str]) -> str:
    """One CUDA file holding each distinct kernel once, as ``thunder_region_0``, ``_1``, ..."""
    distinct = list(dict.fromkeys(sources))
    named = [re.sub(r"\bthunder_region\b", f"thunder_region_{k}", s) for k, s in enumerate(distinct)]
    return PRELUDE + "\n".join(named)
