"""The CuPy executor: fused elementwise regions as ElementwiseKernels, softmax as a RawKernel.

Tensors cross between torch and CuPy through DLPack (``cupy.from_dlpack`` /
``torch.from_dlpack``): no copies.
"""

from __future__ import annotations

import functools

import cupy
import torch

from thunder_core import FusionExecutor, OperatorExecutor, RegionNotSupported, Rejection
from thunder_core.extend import TensorProxy, get_symbol, leaves, prim_symbols
from thunder_executor_cupy.codegen import (
    C_TYPES,
    ELEMENTWISE_OPS,
    SOFTMAX_SOURCE,
    SUPPORTED,
    broadcast_views,
    elementwise_kernel_spec,
    softmax_checker,
)


def _check_tensors(bsym) -> bool | Rejection:
    for x in leaves((bsym.args, bsym.kwargs, bsym.output)):
        if isinstance(x, TensorProxy) and (x.device.type != "cuda" or x.dtype not in C_TYPES):
            return Rejection("cupy kernels take CUDA float32/float16/float64/bool tensors")
    return True


@functools.lru_cache(maxsize=512)
def _elementwise(in_params: str, out_params: str, operation: str):
    return cupy.ElementwiseKernel(in_params, out_params, operation, "thunder_region")


@functools.cache
def _softmax_kernel():
    return cupy.RawKernel(SOFTMAX_SOURCE, "thunder_softmax")


class CupyExecutor(FusionExecutor):
    default_priority = 3

    def __init__(self):
        super().__init__("cupy", version=cupy.__version__)
        for name in ELEMENTWISE_OPS:
            self.register_supported(get_symbol(name))
        for name in SUPPORTED:
            self.register_supported(prim_symbols()[name])

    def check(self, bsym):
        verdict = super().check(bsym)
        return _check_tensors(bsym) if verdict is True else verdict

    def compile_region(self, region):
        try:
            spec = elementwise_kernel_spec(region.bound_symbols, region.inputs, region.outputs)
        except RegionNotSupported:
            raise
        kernel = _elementwise(*spec)
        views = broadcast_views(region.bound_symbols, region.inputs, region.outputs)
        outputs = [(tuple(p.shape), p.dtype) for p in region.outputs]

        def run(*tensors):
            tensors = [t.detach().contiguous() for t in tensors]
            arrays = [
                cupy.from_dlpack(t if view is None else t.view(view)) for t, view in zip(tensors, views)
            ]
            results = [torch.empty(shape, dtype=dtype, device=tensors[0].device) for shape, dtype in outputs]
            with cupy.cuda.ExternalStream(
                torch.cuda.current_stream().cuda_stream
            ):  # torch's stream, in order
                kernel(*arrays, *(cupy.from_dlpack(r) for r in results))
            return tuple(results)

        return run


def softmax(x, dim=None, _stacklevel=3, dtype=None):
    if x.requires_grad and torch.is_grad_enabled():  # autograd must see the operation: torch's kernel
        return torch.nn.functional.softmax(x, dim, dtype=dtype)
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    source = x.detach().contiguous()  # DLPack exports no tensor that requires grad
    out = torch.empty_like(source)
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        _softmax_kernel()((rows,), (min(1024, max(32, 1 << (cols - 1).bit_length())),),
                          (cupy.from_dlpack(source), cupy.from_dlpack(out), rows, cols))  # fmt: skip
    return out


def softmax_executor() -> OperatorExecutor:
    executor = OperatorExecutor("cupy_softmax", version=cupy.__version__)
    executor.register_implementation(get_symbol("softmax"), softmax, checker=softmax_checker)
    return executor
