"""One-row linear layers (batch-1 decoding) as a parallel Numba matrix-vector kernel.

Decoding one token multiplies one activation row by every weight matrix: the work is reading
the weights, so speed is memory bandwidth. PyTorch's CPU ``linear`` on one row reaches a
fraction of it on small core counts; a row-parallel dot product over the contiguous weight
rows streams them at close to copy speed. Claimed only for inference (the output needs no grad),
float32/float64 CPU tensors, a contiguous ``(N, K)`` weight and at least ``MIN_WEIGHT_ELEMENTS``
weights (smaller ones are not worth the parallel start-up).
"""

from __future__ import annotations

import torch

from thunder_core import Rejection
from thunder_core.extend import TensorProxy

MIN_WEIGHT_ELEMENTS = 1 << 16
DTYPES = (torch.float32, torch.float64)


def is_linear(bsym) -> bool:
    return not bsym.symbol.is_prim and bsym.symbol.name == "linear"


def check_one_row_linear(bsym) -> bool | Rejection:
    """Whether ``linear(x, weight, bias)`` is a one-row product this kernel runs."""
    args = list(bsym.args) + list(bsym.kwargs.values())
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    tensors = [t for t in (x, weight, bias) if t is not None]
    if not all(isinstance(t, TensorProxy) for t in tensors):
        return Rejection("numba gemv: linear on tensors only")
    if isinstance(bsym.output, TensorProxy) and bsym.output.requires_grad:
        return Rejection("numba gemv: inference only (the output requires grad)")
    if any(t.device.type != "cpu" or t.dtype != x.dtype for t in tensors) or x.dtype not in DTYPES:
        return Rejection("numba gemv: float32/float64 CPU tensors of one dtype")
    if x.ndim == 0 or x.numel() != x.shape[-1]:
        return Rejection("numba gemv: more than one input row (ATen's matrix multiply is the right kernel)")
    if weight.ndim != 2 or tuple(weight.stride()) != (weight.shape[1], 1):
        return Rejection("numba gemv: a contiguous 2-D weight")
    if bias is not None and (bias.ndim != 1 or bias.stride() != (1,)):
        return Rejection("numba gemv: a contiguous 1-D bias")
    if weight.numel() < MIN_WEIGHT_ELEMENTS:
        return Rejection(f"numba gemv: weights below {MIN_WEIGHT_ELEMENTS} elements stay with ATen")
    return True


def one_row_linear(bsym):
    """The region callable for one claimed ``linear``: the kernel on NumPy views, a fresh output."""
    args = list(bsym.args) + list(bsym.kwargs.values())
    has_bias = len(args) > 2 and args[2] is not None
    out_shape = tuple(bsym.output.shape)
    from thunder_executor_numba.kernels import gemv, gemv_bias  # numba, at the first compile

    def run(x, weight, bias=None):
        out = torch.empty(out_shape, dtype=x.dtype)
        xs = x.detach().reshape(-1).numpy()
        ws = weight.detach().numpy()
        if has_bias:
            gemv_bias(ws, xs, bias.detach().numpy(), out.view(-1).numpy())
        else:
            gemv(ws, xs, out.view(-1).numpy())
        return (out,)

    run.source = "numba gemv: out[i] = sum_j weight[i, j] * x[j]" + (" + bias[i]" if has_bias else "")
    return run
