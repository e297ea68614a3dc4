"""The Numba executor: claims elementwise ops and last-dim reductions on CPU, fuses them.

Each region becomes one generated Numba kernel, written to a file in the cache folder so
that Numba's own on-disk cache (``cache=True``) keeps the compiled code across processes,
and kept in memory per region signature within a process.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

import torch

from thunder_core import FusionExecutor, RegionNotSupported, Rejection
from thunder_core.extend import TensorProxy, has_symbolic_sizes, leaves
from thunder_executor_numba.attention import check_decode_attention, decode_attention, is_attention
from thunder_executor_numba.codegen import (
    DTYPES,
    PRELUDE,
    SHAPE_ONLY,
    SUPPORTED,
    analyze,
    dims,
    flatten_prims,
    generate,
    numel_hint,
    one_element,
)
from thunder_executor_numba.gemv import check_one_row_linear, is_linear, one_row_linear

CACHE_DIR = Path(os.environ.get("THUNDER_NUMBA_CACHE_DIR", Path.home() / ".cache" / "thunder-executor-numba"))
PARALLEL_THRESHOLD = int(os.environ.get("THUNDER_NUMBA_PARALLEL_THRESHOLD", 32768))

# Torch-level ops claimed when their decomposition is made of supported prims.
TORCH_LEVEL = (
    "add", "sub", "mul", "div", "neg", "abs", "exp", "log", "log1p", "expm1", "sin", "cos", "tanh", "sigmoid",
    "sqrt", "rsqrt", "reciprocal", "erf", "pow", "square", "maximum", "minimum", "where", "masked_fill", "clamp",
    "relu", "gelu", "silu", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
    "float", "double", "to", "type_as", "sum", "mean", "amax", "amin", "softmax", "log_softmax", "rms_norm",
    "layer_norm", "rsub", "isnan",
)  # fmt: skip
PRIMS = tuple(f"prims.{name}" for name in sorted(SUPPORTED))


def _prims_supported(bsym) -> bool:
    if bsym.symbol.is_prim:
        return bsym.symbol.name in SUPPORTED
    return bool(bsym.subsymbols) and all(_prims_supported(s) for s in bsym.subsymbols)


def _tensors_supported(bsym) -> bool | Rejection:
    for x in leaves((bsym.args, bsym.kwargs, bsym.output)):
        if isinstance(x, TensorProxy):
            if x.device.type != "cpu":
                return Rejection(
                    f"numba runs CPU tensors here (got {x.device}); numba.cuda needs a CUDA device"
                )
            if x.dtype not in DTYPES:
                return Rejection(f"numba kernels take float32, float64 and bool tensors (got {x.dtype})")
            if 0 in dims(x.shape):
                return Rejection("empty tensor")
    return True


class NumbaExecutor(FusionExecutor):
    default_priority = 5
    takes_symbolic_sizes = True  # fused kernels read their loop bounds per call (codegen.py)

    def __init__(self):
        super().__init__("numba", version=importlib.metadata.version("numba"))
        self._kernels: dict[str, object] = {}
        for name in TORCH_LEVEL + PRIMS:
            try:
                self.register_supported(name)
            except KeyError:  # an op this torch version lacks
                continue
        self.register_supported("linear")  # one-row products only: see gemv.py
        self.register_supported("scaled_dot_product_attention")  # one query over a cache: attention.py

    def check(self, bsym):
        verdict = super().check(bsym)
        if verdict is not True:
            return verdict
        if is_linear(bsym) or is_attention(bsym):
            if has_symbolic_sizes(bsym):
                return Rejection(
                    "numba: its one-row linear and decode attention kernels run fixed sizes only"
                )
            return check_one_row_linear(bsym) if is_linear(bsym) else check_decode_attention(bsym)
        supported = _tensors_supported(bsym)
        if supported is not True:
            return supported
        if not _prims_supported(bsym):
            return Rejection(
                f"numba: the decomposition of {bsym.symbol.printed_name} uses prims it does not generate"
            )
        return True

    def region_weight(self, region) -> int:
        """Prims that compute something (shape-only prims cost nothing in a fused kernel)."""
        if any(is_linear(b) or is_attention(b) for b in region):
            return 1 << 30  # a one-row linear or a decode attention is worth its kernel on its own
        try:
            return sum(1 for b in flatten_prims(region) if b.symbol.name not in SHAPE_ONLY)
        except RegionNotSupported:
            return 0

    def can_join(self, region, bsym) -> bool:
        if any(is_linear(b) or is_attention(b) for b in [*region, bsym]):
            return False  # the matrix-vector and attention kernels run alone
        try:
            analyze([*region, bsym], [])
        except RegionNotSupported:
            return False
        except Exception:
            return False
        return True

    def _load(self, source: str, name: str):
        digest = hashlib.sha256(source.encode()).hexdigest()[:20]
        if digest in self._kernels:
            return self._kernels[digest]
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        module_name = f"thunder_numba_{digest}"
        path = CACHE_DIR / f"{module_name}.py"
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            tmp.replace(path)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        kernel = getattr(module, name)
        self._kernels[digest] = kernel
        return kernel

    def compile_region(self, region):
        if not all(isinstance(p, TensorProxy) for p in region.inputs):
            raise RegionNotSupported("numba: a region input is an int (one the program takes symbolic)")
        if len(region.bound_symbols) == 1 and is_linear(region.bound_symbols[0]):
            return one_row_linear(region.bound_symbols[0])
        if len(region.bound_symbols) == 1 and is_attention(region.bound_symbols[0]):
            return decode_attention(region)
        numel = max((numel_hint(p) for b in region.bound_symbols for p in b.flat_outputs()), default=0)
        try:
            kernel_source = generate(
                region.bound_symbols,
                region.inputs,
                region.outputs,
                parallel=numel >= PARALLEL_THRESHOLD,
                name="kernel",
            )
        except RegionNotSupported:
            raise
        shapes = _output_shapes(kernel_source) if kernel_source.sizes_from is not None else None
        kernel = self._load(PRELUDE + kernel_source.source, "kernel")
        return _runner(kernel, kernel_source, shapes)


def _arrays(tensors, scalar_inputs) -> list:
    """The kernel's input arrays: one-element inputs as one value, the others flat and contiguous."""
    arrays = []
    for t, scalar in zip(tensors, scalar_inputs):
        t = t.detach()
        arrays.append((t.reshape(1) if scalar else t.contiguous().view(-1)).numpy())
    return arrays


def _runner(kernel, spec, shapes=None):
    """The callable the generated trace calls: tensors in, fresh output tensors out. ``shapes``:
    with symbolic sizes, how each output's shape follows from the iteration shape (``_output_shapes``)."""
    scalar_inputs = [one_element(p) for p in spec.inputs]
    dtypes = [p.dtype for p in spec.outputs]
    if shapes is None:
        fixed = [tuple(p.shape) for p in spec.outputs]

        def run(*tensors):
            outputs = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in zip(fixed, dtypes))
            kernel(*_arrays(tensors, scalar_inputs), *(o.view(-1).numpy() for o in outputs))
            return outputs

    else:
        source = spec.sizes_from

        def run(*tensors):
            arrays = _arrays(tensors, scalar_inputs)
            shape = tensors[source].shape
            outputs = tuple(torch.empty(make(shape), dtype=dtype) for make, dtype in zip(shapes, dtypes))
            kernel(*arrays, *(o.view(-1).numpy() for o in outputs), arrays[source].size, shape[-1])
            return outputs

    run.source = spec.source
    return run


def _output_shapes(spec) -> list:
    """With symbolic sizes: each output's shape as a function of the iteration shape read on the
    call (the shape of input ``spec.sizes_from``): that shape, its rows (``S[:-1]``, or
    ``S[:-1] + (1,)``), or fixed."""
    iteration = dims(spec.inputs[spec.sizes_from].shape)
    makers = []
    for p in spec.outputs:
        shape = dims(p.shape)
        if shape == iteration:
            makers.append(lambda s: s)
        elif shape == iteration[:-1]:
            makers.append(lambda s: s[:-1])
        elif shape == iteration[:-1] + (1,):
            makers.append(lambda s: (*s[:-1], 1))
        elif all(isinstance(d, int) for d in shape):
            makers.append(lambda s, fixed=shape: fixed)
        else:
            raise RegionNotSupported(
                f"numba: output {p.name} of shape {tuple(p.shape)} is no row shape of the region"
            )
    return makers
