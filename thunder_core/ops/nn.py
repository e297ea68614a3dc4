"""Neural-network torch ops: linear algebra, embedding, norms, softmax, attention, losses, dropout."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from thunder_core.ir.symbols import RANDOM, WHOLE
from thunder_core.ops import prims
from thunder_core.ops._helpers import (
    LOW_PRECISION,
    NoDecomposition,
    broadcast_to,
    canonical_dim,
    convert,
    in_float32,
)
from thunder_core.ops.reductions import _keep
from thunder_core.ops.registry import register_torch_op, swap_first_two
from thunder_core.ops.shapes import _reshape, _transpose

T = torch.Tensor


def _matmul(a, b, *, out=None):
    if out is not None or a.dtype != b.dtype:
        raise NoDecomposition
    return prims.matmul(a, b)


register_torch_op(
    "matmul", torch.matmul, T.matmul, T.__matmul__, (T.__rmatmul__, swap_first_two), decomposition=_matmul
)
register_torch_op("mm", torch.mm, T.mm, decomposition=_matmul)
register_torch_op("bmm", torch.bmm, T.bmm, decomposition=_matmul)


def _linear(x, weight, bias=None):
    if bias is not None and x.dtype in LOW_PRECISION:
        # Eager adds the bias inside the matrix product and rounds once; a product rounded to
        # float16/bfloat16 and then added rounds twice (several units in the last place apart).
        raise NoDecomposition
    out = prims.matmul(x, _transpose(weight, 0, 1) if weight.ndim == 2 else weight)
    if bias is not None:
        out = prims.add(out, broadcast_to(bias, tuple(out.shape)))
    return out


register_torch_op("linear", F.linear, decomposition=_linear)


def _embedding(
    indices, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False
):
    if max_norm is not None:
        raise NoDecomposition  # renormalizes the weight in place
    flat = prims.reshape(indices, (-1,)) if indices.ndim != 1 else indices
    rows = prims.take(weight, flat, 0)
    return prims.reshape(rows, (*indices.shape, weight.shape[1])) if indices.ndim != 1 else rows


register_torch_op("embedding", F.embedding, decomposition=_embedding)


def _normalize(x, dims, eps, *, center: bool):
    """(x - mean) / sqrt(var + eps) over ``dims`` (no centering for RMSNorm)."""
    shape = tuple(x.shape)
    count = math.prod(shape[d] for d in dims)
    if center:
        mean = prims.div(prims.sum(x, dims), count)
        x = prims.sub(x, broadcast_to(_keep(mean, x, dims, True), shape))
    power = prims.div(prims.sum(prims.mul(x, x), dims), count)
    scale = prims.rsqrt(prims.add(power, eps))
    return prims.mul(x, broadcast_to(_keep(scale, x, dims, True), shape))


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    out = _normalize(in_float32(x), dims, eps, center=True)
    if weight is not None:
        out = prims.mul(out, broadcast_to(in_float32(weight), tuple(out.shape)))
    if bias is not None:
        out = prims.add(out, broadcast_to(in_float32(bias), tuple(out.shape)))
    return convert(out, x.dtype)


register_torch_op("layer_norm", F.layer_norm, decomposition=_layer_norm)


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    out = _normalize(in_float32(x), dims, eps, center=False)
    if weight is not None:
        out = prims.mul(out, broadcast_to(in_float32(weight), tuple(out.shape)))
    return convert(out, x.dtype)


if hasattr(F, "rms_norm"):
    register_torch_op("rms_norm", F.rms_norm, decomposition=_rms_norm)


def _softmax_parts(a, dim, dtype):
    x = in_float32(convert(a, dtype) if dtype is not None else a)
    dims = (canonical_dim(dim, a.ndim),) if a.ndim else ()
    shape = tuple(a.shape)
    shifted = prims.sub(x, broadcast_to(_keep(prims.amax(x, dims), a, dims, True), shape))
    exps = prims.exp(shifted)
    total = broadcast_to(_keep(prims.sum(exps, dims), a, dims, True), shape)
    result_dtype = dtype or a.dtype
    return shifted, exps, total, result_dtype


def _softmax(a, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        raise NoDecomposition
    _, exps, total, result_dtype = _softmax_parts(a, dim, dtype)
    return convert(prims.div(exps, total), result_dtype)


def _log_softmax(a, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        raise NoDecomposition
    shifted, _, total, result_dtype = _softmax_parts(a, dim, dtype)
    return convert(prims.sub(shifted, prims.log(total)), result_dtype)


register_torch_op("softmax", F.softmax, torch.softmax, T.softmax, decomposition=_softmax)
register_torch_op("log_softmax", F.log_softmax, torch.log_softmax, T.log_softmax, decomposition=_log_softmax)


def _dropout(a, p=0.5, training=True, inplace=False):
    if inplace or not training or p == 0:
        raise NoDecomposition
    if p == 1:
        return prims.mul(a, 0.0)
    keep = prims.ge(prims.uniform(tuple(a.shape), 0.0, 1.0, a.dtype, a.device), p)
    return prims.div(prims.where(keep, a, 0.0), 1 - p)


register_torch_op("dropout", F.dropout, decomposition=_dropout, tags=(RANDOM,))


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    q, k, v = query, key, value  # named as F.scaled_dot_product_attention's parameters, for keyword calls
    if dropout_p != 0.0:
        raise NoDecomposition
    from thunder_core.ops.shapes import _repeat_interleave

    if enable_gqa and k.shape[-3] != q.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        k, v = _repeat_interleave(k, groups, -3), _repeat_interleave(v, groups, -3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = prims.mul(prims.matmul(q, _transpose(k, -2, -1)), scale)
    shape = tuple(scores.shape)
    length, source = shape[-2], shape[-1]
    if is_causal:
        row = prims.broadcast_in_dim(prims.iota(length, 0, 1, torch.int64, q.device), (length, source), (0,))
        col = prims.broadcast_in_dim(prims.iota(source, 0, 1, torch.int64, q.device), (length, source), (1,))
        attn_mask = prims.le(col, row)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = prims.where(broadcast_to(attn_mask, shape), scores, -math.inf)
        else:
            scores = prims.add(scores, broadcast_to(convert(attn_mask, scores.dtype), shape))
    weights = _softmax(scores, -1)
    return prims.matmul(weights, v)


# Attention stays whole unless an executor claims it whole: eager's fused kernels (flash or
# memory-efficient attention) beat any split into a materialized matmul-softmax-matmul.
register_torch_op(
    "scaled_dot_product_attention", F.scaled_dot_product_attention, decomposition=_sdpa, tags=(WHOLE,)
)


def _cross_entropy(
    logits,
    target,
    weight=None,
    size_average=None,
    ignore_index=-100,
    reduce=None,
    reduction="mean",
    label_smoothing=0.0,
):
    if weight is not None or size_average is not None or reduce is not None or label_smoothing != 0.0:
        raise NoDecomposition
    if (
        target.dtype.is_floating_point
        or logits.ndim not in (1, 2)
        or reduction not in ("mean", "sum", "none")
    ):
        raise NoDecomposition  # probabilities as targets, or K-dimensional inputs
    class_dim = 0 if logits.ndim == 1 else 1
    logp = _log_softmax(logits, class_dim)
    if logits.ndim == 1:
        logp, target = _reshape(logp, (1, -1)), _reshape(target, (1,))
    valid = prims.ne(target, ignore_index)
    safe_target = prims.where(valid, target, 0)
    picked = prims.gather(logp, 1, prims.broadcast_in_dim(safe_target, (target.shape[0], 1), (0,)))
    losses = prims.where(valid, prims.neg(prims.reshape(picked, (target.shape[0],))), 0.0)
    if reduction == "none":
        return prims.reshape(losses, ()) if logits.ndim == 1 else losses
    total = prims.sum(losses, (0,))
    if reduction == "sum":
        return total
    count = prims.sum(convert(valid, logp.dtype), (0,))
    return prims.div(total, count)


register_torch_op("cross_entropy", F.cross_entropy, decomposition=_cross_entropy)
