"""Shape and layout torch ops: views, reshapes, joins and splits."""

from __future__ import annotations

import math

import torch

from thunder_core.ir.symbolic import same_sizes
from thunder_core.ops import prims
from thunder_core.ops._helpers import Kind as _Kind
from thunder_core.ops._helpers import (
    NoDecomposition,
    broadcast_to,
    canonical_dim,
    canonical_dims,
    convert,
    is_tensor,
    promote,
)
from thunder_core.ops.registry import register_torch_op

T = torch.Tensor

VIEW_OPS = frozenset(
    {
        "reshape", "view", "permute", "transpose", "t", "expand", "expand_as", "unsqueeze", "squeeze",
        "broadcast_in_dim", "slice", "getitem", "narrow", "flatten", "unflatten",
        "split", "chunk", "unbind", "movedim", "view_as", "reshape_as",
    }
)  # fmt: skip
"""Names of the torch-level ops and prims that describe a view of their input: they allocate
nothing (``reshape`` can copy a non-contiguous input) and compute nothing."""

ALWAYS_VIEWS = frozenset(
    {
        "view", "view_as", "permute", "transpose", "t", "expand", "expand_as", "unsqueeze", "squeeze",
        "movedim", "broadcast_in_dim", "slice", "narrow", "select", "split", "chunk", "unbind",
    }
)  # fmt: skip
"""The view ops whose result is a view of their input whatever its strides (never a copy)."""


def always_a_view(bsym) -> bool:
    """Whether a bound symbol returns views of its tensor argument and never copies: an op of
    ``ALWAYS_VIEWS``, or a view op that decomposes into them only (``x[1:, None]``: basic
    indexing is slices, squeezes and unsqueezes)."""
    name = bsym.symbol.name
    if name in ALWAYS_VIEWS:
        return True
    subsymbols = bsym.subsymbols
    return name in VIEW_OPS and bool(subsymbols) and all(s.symbol.name in ALWAYS_VIEWS for s in subsymbols)


def _sizes(args) -> tuple:
    """``view(2, 3)`` and ``view((2, 3))`` both mean (2, 3)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(args[0])
    return tuple(args)


def _infer(shape, numel: int) -> tuple[int, ...]:
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


def _reshape(a, *shape):
    if any(isinstance(s, torch.dtype) for s in shape):
        raise NoDecomposition  # view(dtype) reinterprets bits
    target = _infer(_sizes(shape), a.numel())
    if same_sizes(target, a.shape):
        raise NoDecomposition  # a no-op: the torch-level op stays a leaf
    return prims.reshape(a, target)


# Where a Tensor method takes more call forms (``x.reshape(2, 3)`` and ``x.reshape((2, 3))``)
# than the torch function, the method is the impl so that every alias can be run by it.
register_torch_op("reshape", T.reshape, torch.reshape, decomposition=_reshape)
register_torch_op("view", T.view, decomposition=_reshape)
register_torch_op("view_as", T.view_as, decomposition=lambda a, other: _reshape(a, tuple(other.shape)))
register_torch_op("reshape_as", T.reshape_as, decomposition=lambda a, other: _reshape(a, tuple(other.shape)))


def _flatten(a, start_dim=0, end_dim=-1):
    if a.ndim == 0:
        return _reshape(a, (1,))
    start, end = canonical_dim(start_dim, a.ndim), canonical_dim(end_dim, a.ndim)
    shape = (*a.shape[:start], math.prod(a.shape[start : end + 1]), *a.shape[end + 1 :])
    return _reshape(a, shape)


register_torch_op("flatten", torch.flatten, T.flatten, decomposition=_flatten)


def _unflatten(a, dim, sizes):
    dim = canonical_dim(dim, a.ndim)
    inner = _infer(sizes, a.shape[dim])
    return _reshape(a, (*a.shape[:dim], *inner, *a.shape[dim + 1 :]))


register_torch_op("unflatten", torch.unflatten, T.unflatten, decomposition=_unflatten)


def _permute(a, *dims):
    dims = tuple(canonical_dim(d, a.ndim) for d in _sizes(dims))
    if dims == tuple(range(a.ndim)):
        raise NoDecomposition
    return prims.permute(a, dims)


register_torch_op("permute", T.permute, torch.permute, decomposition=_permute)


def _transpose(a, dim0, dim1):
    if a.ndim < 2:
        raise NoDecomposition
    dims = list(range(a.ndim))
    d0, d1 = canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return _permute(a, dims)


register_torch_op(
    "transpose",
    torch.transpose,
    T.transpose,
    torch.swapaxes,
    T.swapaxes,
    torch.swapdims,
    decomposition=_transpose,
)
register_torch_op("t", torch.t, T.t, decomposition=lambda a: _transpose(a, 0, 1))
register_torch_op("T", T.T.__get__, decomposition=lambda a: _permute(a, tuple(reversed(range(a.ndim)))))
register_torch_op("mT", T.mT.__get__, decomposition=lambda a: _transpose(a, -2, -1))
register_torch_op("contiguous", T.contiguous)


def _expand(a, *sizes):
    sizes = _sizes(sizes)
    offset = len(sizes) - a.ndim
    shape = tuple(a.shape[i - offset] if s == -1 else s for i, s in enumerate(sizes))
    if same_sizes(shape, a.shape):
        raise NoDecomposition
    return broadcast_to(a, shape)


register_torch_op("expand", T.expand, decomposition=_expand)
register_torch_op("expand_as", T.expand_as, decomposition=lambda a, other: _expand(a, tuple(other.shape)))
register_torch_op("broadcast_to", torch.broadcast_to, T.broadcast_to, decomposition=_expand)


def _unsqueeze(a, dim):
    dim = canonical_dim(dim, a.ndim + 1)
    shape = (*a.shape[:dim], 1, *a.shape[dim:])
    return prims.broadcast_in_dim(a, shape, tuple(d for d in range(a.ndim + 1) if d != dim))


register_torch_op("unsqueeze", torch.unsqueeze, T.unsqueeze, decomposition=_unsqueeze)


def _squeeze(a, dim=None):
    if isinstance(dim, (tuple, list)) and not dim:
        raise NoDecomposition  # squeeze(x, ()) squeezes nothing
    dims = canonical_dims(dim, a.ndim) if dim is not None else tuple(range(a.ndim))
    dims = tuple(d for d in dims if a.shape[d] == 1)
    if not dims:
        raise NoDecomposition
    return prims.squeeze(a, dims)


register_torch_op("squeeze", torch.squeeze, T.squeeze, decomposition=_squeeze)


def _cat(tensors, dim=0, *, out=None):
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)
    if out is not None or len(tensors) < 2:
        raise NoDecomposition
    _, result = promote(*tensors, kind=_Kind.NO_OPMATH)
    dim = canonical_dim(dim, tensors[0].ndim)
    return prims.cat([convert(t, result) for t in tensors], dim)


register_torch_op("cat", torch.cat, torch.concat, torch.concatenate, decomposition=_cat)


def _stack(tensors, dim=0, *, out=None):
    if out is not None or not tensors:
        raise NoDecomposition
    dim = canonical_dim(dim, tensors[0].ndim + 1)
    expanded = [_unsqueeze(t, dim) for t in tensors]
    return _cat(expanded, dim) if len(expanded) > 1 else expanded[0]


register_torch_op("stack", torch.stack, decomposition=_stack)


def _narrow_slice(a, dim: int, start: int, stop: int):
    starts = [0] * a.ndim
    ends = list(a.shape)
    starts[dim], ends[dim] = start, stop
    return prims.slice(a, starts, ends)


def _split(a, split_size_or_sections, dim=0):
    dim = canonical_dim(dim, a.ndim)
    length = a.shape[dim]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        sections = [min(size, length - i) for i in range(0, length, size)] if size else [length]
    else:
        sections = list(split_size_or_sections)
    bounds, start = [], 0
    for size in sections:
        bounds.append((start, start + size))
        start += size
    return tuple(_narrow_slice(a, dim, lo, hi) for lo, hi in bounds)


register_torch_op("split", torch.split, T.split, decomposition=_split)


def _split_with_sizes(a, split_sizes, dim=0):
    return _split(a, list(split_sizes), dim)


register_torch_op(
    "split_with_sizes", torch.split_with_sizes, T.split_with_sizes, decomposition=_split_with_sizes
)


def _chunk(a, chunks, dim=0):
    dim = canonical_dim(dim, a.ndim)
    size = -(-a.shape[dim] // chunks)
    return _split(a, size, dim) if a.shape[dim] else _split(a, [0] * 1, dim)


register_torch_op("chunk", torch.chunk, T.chunk, decomposition=_chunk)


def _narrow(a, dim, start, length):
    if is_tensor(start):
        raise NoDecomposition
    dim = canonical_dim(dim, a.ndim)
    start = start % a.shape[dim] if start < 0 else start
    return _narrow_slice(a, dim, start, start + length)


register_torch_op("narrow", torch.narrow, T.narrow, decomposition=_narrow)


def _unbind(a, dim=0):
    dim = canonical_dim(dim, a.ndim)
    return tuple(prims.squeeze(_narrow_slice(a, dim, i, i + 1), (dim,)) for i in range(a.shape[dim]))


register_torch_op("unbind", torch.unbind, T.unbind, decomposition=_unbind)


def _flip(a, *dims, **kwargs):
    dims = canonical_dims(_sizes(dims) if dims else tuple(kwargs.pop("dims")), a.ndim)
    return prims.flip(a, dims)


register_torch_op("flip", T.flip, torch.flip, decomposition=_flip)


def _triangle(lower: bool):
    def decomposition(a, diagonal=0, *, out=None):
        if out is not None or a.ndim < 2:
            raise NoDecomposition
        rows, cols = a.shape[-2], a.shape[-1]
        row = prims.broadcast_in_dim(prims.iota(rows, 0, 1, torch.int64, a.device), (rows, cols), (0,))
        col = prims.broadcast_in_dim(prims.iota(cols, 0, 1, torch.int64, a.device), (rows, cols), (1,))
        offset = prims.sub(col, row)
        keep = prims.le(offset, diagonal) if lower else prims.ge(offset, diagonal)
        keep = broadcast_to(keep, tuple(a.shape))
        zero = False if a.dtype == torch.bool else 0
        return prims.where(keep, a, zero)

    return decomposition


register_torch_op("tril", torch.tril, T.tril, decomposition=_triangle(True))
register_torch_op("triu", torch.triu, T.triu, decomposition=_triangle(False))


def _repeat(a, *sizes):
    sizes = _sizes(sizes)
    padded = (1,) * (len(sizes) - a.ndim) + tuple(a.shape)
    expanded_shape, dims = [], []
    for i, (rep, size) in enumerate(zip(sizes, padded)):
        expanded_shape += [rep, size]
        dims.append(2 * i + 1)
    x = a if same_sizes(padded, a.shape) else _reshape(a, padded)
    x = prims.broadcast_in_dim(x, tuple(expanded_shape), tuple(dims))
    return prims.reshape(x, tuple(r * s for r, s in zip(sizes, padded)))


register_torch_op("repeat", T.repeat, decomposition=_repeat)


def _repeat_interleave(a, repeats, dim=None, *, output_size=None):
    if is_tensor(repeats) or not is_tensor(a):
        raise NoDecomposition
    if dim is None:
        a, dim = _reshape(a, (-1,)), 0
    dim = canonical_dim(dim, a.ndim)
    shape = (*a.shape[: dim + 1], repeats, *a.shape[dim + 1 :])
    kept = tuple(d if d <= dim else d + 1 for d in range(a.ndim))
    x = prims.broadcast_in_dim(a, shape, kept)
    return prims.reshape(x, (*a.shape[:dim], a.shape[dim] * repeats, *a.shape[dim + 1 :]))


register_torch_op(
    "repeat_interleave", torch.repeat_interleave, T.repeat_interleave, decomposition=_repeat_interleave
)
