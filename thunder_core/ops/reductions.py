"""Reductions: sum, mean, var/std, amax/amin, max/min, argmax/argmin, prod, any/all, cumsum, topk."""

from __future__ import annotations

import math

import torch

from thunder_core.ops import prims
from thunder_core.ops._helpers import (
    NoDecomposition,
    broadcast_to,
    canonical_dim,
    canonical_dims,
    convert,
    is_tensor,
)
from thunder_core.ops.registry import register_torch_op

T = torch.Tensor


def _keep(result, a, dims, keepdim: bool):
    """Put reduced dims back as size 1 when ``keepdim``."""
    if not keepdim or not dims:
        return result
    shape = tuple(1 if d in dims else s for d, s in enumerate(a.shape))
    kept = tuple(d for d in range(a.ndim) if d not in dims)
    return prims.broadcast_in_dim(result, shape, kept)


def _accumulation_dtype(a, dtype):
    if dtype is not None:
        return dtype
    if a.dtype == torch.bool or not (a.dtype.is_floating_point or a.dtype.is_complex):
        return torch.int64
    return a.dtype


def _sum(a, dim=None, keepdim=False, *, dtype=None, out=None):
    if out is not None:
        raise NoDecomposition
    dims = canonical_dims(dim, a.ndim)
    result_dtype = _accumulation_dtype(a, dtype)
    computation = torch.float32 if result_dtype in (torch.float16, torch.bfloat16) else result_dtype
    return convert(_keep(prims.sum(convert(a, computation), dims), a, dims, keepdim), result_dtype)


register_torch_op("sum", torch.sum, T.sum, decomposition=_sum)


def _mean(a, dim=None, keepdim=False, *, dtype=None, out=None):
    if out is not None:
        raise NoDecomposition
    result_dtype = dtype or a.dtype
    if not (result_dtype.is_floating_point or result_dtype.is_complex):
        raise NoDecomposition  # torch raises for integer inputs
    dims = canonical_dims(dim, a.ndim)
    computation = torch.float32 if result_dtype in (torch.float16, torch.bfloat16) else result_dtype
    total = prims.sum(convert(a, computation), dims)
    count = math.prod(a.shape[d] for d in dims)
    return convert(_keep(prims.div(total, count), a, dims, keepdim), result_dtype)


register_torch_op("mean", torch.mean, T.mean, decomposition=_mean)


def _var_args(args, kwargs):
    """torch.var's overloads: (dim, unbiased, keepdim) / (unbiased) / (dim, *, correction, keepdim)."""
    dim, correction, keepdim = None, 1, kwargs.pop("keepdim", False)
    args = list(args)
    if args and isinstance(args[0], bool):
        correction = int(args.pop(0))
    if args:
        dim = args.pop(0)
    if args and isinstance(args[0], bool):
        correction = int(args.pop(0))
    if args:
        keepdim = args.pop(0)
    dim = kwargs.pop("dim", dim)
    if "unbiased" in kwargs:
        correction = int(kwargs.pop("unbiased"))
    if "correction" in kwargs:
        correction = kwargs.pop("correction")
        correction = 1 if correction is None else correction
    if kwargs or args:
        raise NoDecomposition
    return dim, correction, keepdim


def _var(a, *args, **kwargs):
    dim, correction, keepdim = _var_args(args, dict(kwargs))
    if not a.dtype.is_floating_point:
        raise NoDecomposition
    dims = canonical_dims(dim, a.ndim)
    computation = torch.float32 if a.dtype in (torch.float16, torch.bfloat16) else a.dtype
    result = prims.var(convert(a, computation), dims, correction)
    return convert(_keep(result, a, dims, keepdim), a.dtype)


def _std(a, *args, **kwargs):
    return prims.sqrt(_var(a, *args, **kwargs))


register_torch_op("var", torch.var, T.var, decomposition=_var)
register_torch_op("std", torch.std, T.std, decomposition=_std)


def _extremum(prim):
    def decomposition(a, dim=None, keepdim=False, *, out=None):
        if out is not None:
            raise NoDecomposition
        dims = canonical_dims(dim, a.ndim)
        return _keep(prim(a, dims), a, dims, keepdim)

    return decomposition


register_torch_op("amax", torch.amax, T.amax, decomposition=_extremum(prims.amax))
register_torch_op("amin", torch.amin, T.amin, decomposition=_extremum(prims.amin))


def _arg_extremum(prim):
    def decomposition(a, dim=None, keepdim=False, *, out=None):
        if out is not None:
            raise NoDecomposition
        if dim is None:
            flat = prims.reshape(a, (-1,)) if a.ndim != 1 else a
            result = prim(flat, 0)
            if keepdim:
                return prims.reshape(result, (1,) * a.ndim)
            return result
        d = canonical_dim(dim, a.ndim)
        result = prim(a, d) if a.ndim else prim(a, None)
        return _keep(result, a, (d,), keepdim and a.ndim > 0)

    return decomposition


register_torch_op("argmax", torch.argmax, T.argmax, decomposition=_arg_extremum(prims.argmax))
register_torch_op("argmin", torch.argmin, T.argmin, decomposition=_arg_extremum(prims.argmin))


def _max_or_min(extremum_prim, binary_prim):
    def decomposition(a, dim=None, keepdim=False, *, out=None):
        if out is not None:
            raise NoDecomposition
        if is_tensor(dim):  # torch.max(a, b): elementwise
            from thunder_core.ops._helpers import Kind
            from thunder_core.ops.elementwise import _binary

            return _binary(binary_prim, Kind.DEFAULT)(a, dim)
        if dim is None:
            return extremum_prim(a, tuple(range(a.ndim)))
        raise NoDecomposition  # (values, indices) keeps torch's kernel for tie-breaking

    return decomposition


register_torch_op("max", torch.max, T.max, decomposition=_max_or_min(prims.amax, prims.maximum))
register_torch_op("min", torch.min, T.min, decomposition=_max_or_min(prims.amin, prims.minimum))


def _prod(a, dim=None, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, a.ndim)
    result_dtype = _accumulation_dtype(a, dtype)
    return _keep(prims.prod(convert(a, result_dtype), dims), a, dims, keepdim)


register_torch_op("prod", torch.prod, T.prod, decomposition=_prod)


def _any_all(prim):
    def decomposition(a, dim=None, keepdim=False, *, out=None):
        if out is not None or a.dtype == torch.uint8:
            raise NoDecomposition
        dims = canonical_dims(dim, a.ndim)
        truth = prims.ne(a, 0) if a.dtype != torch.bool else a
        return _keep(prim(truth, dims), a, dims, keepdim)

    return decomposition


register_torch_op("any", torch.any, T.any, decomposition=_any_all(prims.amax))
register_torch_op("all", torch.all, T.all, decomposition=_any_all(prims.amin))


def _logsumexp(a, dim, keepdim=False):
    dims = canonical_dims(dim, a.ndim)
    computation = torch.float32 if a.dtype in (torch.float16, torch.bfloat16) else a.dtype
    if not computation.is_floating_point:
        raise NoDecomposition
    x = convert(a, computation)
    peak = prims.amax(x, dims)
    safe = prims.where(prims.isinf(peak), 0.0, peak)
    safe_b = broadcast_to(_keep(safe, a, dims, True), tuple(a.shape))
    total = prims.sum(prims.exp(prims.sub(x, safe_b)), dims)
    return convert(_keep(prims.add(prims.log(total), safe), a, dims, keepdim), a.dtype)


register_torch_op("logsumexp", torch.logsumexp, T.logsumexp, decomposition=_logsumexp)


def _cumsum(a, dim, *, dtype=None, out=None):
    if out is not None:
        raise NoDecomposition
    result_dtype = _accumulation_dtype(a, dtype)
    return prims.cumsum(convert(a, result_dtype), canonical_dim(dim, a.ndim))


register_torch_op("cumsum", torch.cumsum, T.cumsum, decomposition=_cumsum)


def _topk(a, k, dim=-1, largest=True, sorted=True, *, out=None):
    if out is not None:
        raise NoDecomposition
    return prims.topk(a, k, canonical_dim(dim, a.ndim), largest, sorted)


register_torch_op("topk", torch.topk, T.topk, decomposition=_topk)
