"""Decompositions of the ATen backward kernels the VJP rules use.

The torch executor runs the fused ATen kernel; a fusion executor can claim the
decomposition instead and fuse it with its neighbours.
"""

from __future__ import annotations

import math

import torch

from thunder_core.autodiff import kernels as K
from thunder_core.autodiff.rules import basic_index_backward
from thunder_core.ops._helpers import NoDecomposition, canonical_dim, convert, in_float32
from thunder_core.ops.indexing import expand_basic_index, slice_bounds
from thunder_core.ops.registry import TORCH_SYMBOLS as S


def _opmath(*tensors):
    """The tensors as eager's fused kernels compute them: float16/bfloat16 in float32, the result
    rounded once (a chain of low-precision operations rounded after each, as a fusion executor
    that emulates eager's separate kernels computes it, is several units in the last place away)."""
    return [in_float32(t) for t in tensors]


def _softmax_backward(g, out, dim, input_dtype):
    d = canonical_dim(dim, out.ndim)
    g, out = _opmath(g, out)
    dot = S["sum"](S["mul"](g, out), d, True)
    return convert(S["mul"](S["sub"](g, dot), out), input_dtype)


def _log_softmax_backward(g, out, dim, input_dtype):
    d = canonical_dim(dim, out.ndim)
    g, out = _opmath(g, out)
    total = S["sum"](g, d, True)
    return convert(S["sub"](g, S["mul"](S["exp"](out), total)), input_dtype)


def _log_softmax(x, dim, half_to_float):
    if half_to_float:
        raise NoDecomposition
    return S["log_softmax"](x, dim)


def _gelu_backward(g, x, *, approximate="none"):
    if approximate != "none":
        raise NoDecomposition
    dtype = torch.promote_types(g.dtype, x.dtype)
    g, x = _opmath(g, x)
    cdf = S["mul"](S["add"](S["erf"](S["mul"](x, 1 / math.sqrt(2))), 1.0), 0.5)
    pdf = S["mul"](S["exp"](S["mul"](S["mul"](x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return convert(S["mul"](g, S["add"](cdf, S["mul"](x, pdf))), dtype)


def _silu_backward(g, x):
    dtype = torch.promote_types(g.dtype, x.dtype)
    g, x = _opmath(g, x)
    s = S["sigmoid"](x)
    return convert(S["mul"](S["mul"](g, s), S["add"](S["mul"](x, S["rsub"](s, 1.0)), 1.0)), dtype)


def _tanh_backward(g, y):
    dtype = torch.promote_types(g.dtype, y.dtype)
    g, y = _opmath(g, y)
    return convert(S["mul"](g, S["rsub"](S["mul"](y, y), 1.0)), dtype)


def _sigmoid_backward(g, y):
    dtype = torch.promote_types(g.dtype, y.dtype)
    g, y = _opmath(g, y)
    return convert(S["mul"](S["mul"](g, S["rsub"](y, 1.0)), y), dtype)  # eager's order: g * (1 - y) * y


def _threshold_backward(g, x, threshold):
    if isinstance(threshold, torch.Tensor):
        raise NoDecomposition
    return S["where"](S["le"](x, threshold), 0.0, g)


def _nll_loss_backward(g, logp, target, weight, reduction, ignore_index, total_weight):
    """``-g`` (over the total weight for a mean) at each row's target class, zero elsewhere and
    on ignored rows: a comparison against a column index, which a fusion executor fuses into the
    log-softmax backward that reads it, instead of a zero-filled and scattered ``[N, C]`` tensor."""
    if weight is not None or logp.ndim != 2 or reduction not in (0, 1, 2):
        raise NoDecomposition
    scale = S["neg"](g)
    if reduction == 1:  # mean: divided by the number of rows not ignored
        scale = S["div"](scale, total_weight)
    elif reduction == 0:  # none: one gradient per row
        scale = S["unsqueeze"](scale, 1)
    counted = S["unsqueeze"](S["ne"](target, ignore_index), 1)
    classes = S["arange"](logp.shape[1], device=logp.device)
    is_target = S["logical_and"](S["eq"](S["unsqueeze"](target, 1), classes), counted)
    return S["where"](is_target, convert(scale, logp.dtype), S["new_zeros"](logp, ()))


def _basic_index_backward(g, shape, index):
    """Zeros of ``shape`` with ``g`` at ``index``, as a reshape and a zero-padding cat per sliced dim."""
    items = expand_basic_index(index if type(index) is tuple else (index,), len(shape))
    spans = []  # (start, length) per dim of ``shape``
    for item, size in zip((item for item in items if item is not None), shape):
        if isinstance(item, slice):
            start, stop, step = slice_bounds(item, size)
            if step != 1:
                raise NoDecomposition
            spans.append((start, torch.sym_max(stop - start, 0)))
        else:
            spans.append((item % size, 1))
    if g.numel() == 0:
        return S["new_zeros"](g, tuple(shape))
    grad = S["reshape"](g, tuple(length for _, length in spans))
    for dim, ((start, length), size) in enumerate(zip(spans, shape)):
        if length == size:
            continue
        before, after = (
            [S["new_zeros"](grad, (*grad.shape[:dim], width, *grad.shape[dim + 1 :]))] if width else []
            for width in (start, size - start - length)
        )
        grad = S["cat"]([*before, grad, *after], dim)
    return grad


for _symbol, _decomposition in (
    (basic_index_backward, _basic_index_backward),
    (K.softmax_backward, _softmax_backward),
    (K.log_softmax_backward, _log_softmax_backward),
    (K.log_softmax, _log_softmax),
    (K.gelu_backward, _gelu_backward),
    (K.silu_backward, _silu_backward),
    (K.tanh_backward, _tanh_backward),
    (K.sigmoid_backward, _sigmoid_backward),
    (K.threshold_backward, _threshold_backward),
    (K.nll_loss_backward, _nll_loss_backward),
):
    _symbol.decomposition = _decomposition
