"""Indexing: getitem (basic and advanced), gather, scatter, index_select."""

from __future__ import annotations

import torch

from thunder_core.ir.symbolic import known_equal
from thunder_core.ops import prims
from thunder_core.ops._helpers import NoDecomposition, canonical_dim, is_tensor
from thunder_core.ops.registry import register_torch_op

T = torch.Tensor


def slice_bounds(item: slice, size) -> tuple:
    """``item.indices(size)`` for a positive step, also when ``size`` or a bound is a SymInt
    (``slice.indices`` would turn it into a plain int, specializing the size)."""
    step = 1 if item.step is None else item.step
    if not isinstance(step, int) or step <= 0:
        raise NoDecomposition

    def bound(value, default):
        if value is None:
            return default
        if value < 0:  # for a SymInt (x[:-n], n an int taken symbolic) a guard on its sign
            value = value + size
        return torch.sym_min(torch.sym_max(value, 0), size)

    return bound(item.start, 0), bound(item.stop, size), step


def _is_advanced(item) -> bool:
    return is_tensor(item) or isinstance(item, (list, tuple))


def expand_basic_index(items, ndim: int) -> list:
    """A basic index (ints, slices, None, one Ellipsis) with the Ellipsis spelled out as slices
    and trailing dims filled with ``slice(None)``: one item per dim, plus the ``None``s."""
    consuming = sum(1 for item in items if item is not None and item is not Ellipsis)
    expanded = []
    for item in items:
        if item is Ellipsis:
            expanded += [slice(None)] * (ndim - consuming)
        else:
            expanded.append(item)
    return expanded + [slice(None)] * (ndim - sum(1 for item in expanded if item is not None))


def _getitem(a, index):
    items = index if type(index) is tuple else (index,)
    if any(_is_advanced(item) for item in items):
        if any(is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in items):
            raise NoDecomposition
        return prims.index(a, tuple(items))
    if any(isinstance(item, bool) for item in items):
        raise NoDecomposition
    expanded = expand_basic_index(items, a.ndim)
    starts, ends, steps, squeezed, out_shape = [], [], [], [], []
    dim = 0
    for item in expanded:
        if item is None:
            out_shape.append(("new", None))
            continue
        size = a.shape[dim]
        if isinstance(item, (int, torch.SymInt)):
            i = item + size if item < 0 else item
            if not 0 <= i < size:
                raise IndexError(f"index {item} is out of bounds for dimension {dim} with size {size}")
            starts.append(i), ends.append(i + 1), steps.append(1)
            squeezed.append(dim)
        else:
            start, stop, step = slice_bounds(item, size)
            stop = torch.sym_max(stop, start)
            starts.append(start), ends.append(stop), steps.append(step)
            out_shape.append(("kept", dim))
        dim += 1
    x = a
    # A symbolic bound that may or may not be the whole dim slices anyway (no guard on it).
    if not (
        all(known_equal(s, 0) for s in starts)
        and all(known_equal(e, n) for e, n in zip(ends, a.shape))
        and all(s == 1 for s in steps)
    ):
        x = prims.slice(x, starts, ends, steps)
    if squeezed:
        x = prims.squeeze(x, tuple(squeezed))
    if any(kind == "new" for kind, _ in out_shape):
        kept_sizes = list(x.shape)
        shape, dims, position = [], [], 0
        for i, (kind, _) in enumerate(out_shape):
            if kind == "new":
                shape.append(1)
            else:
                shape.append(kept_sizes[position])
                dims.append(i)
                position += 1
        x = prims.broadcast_in_dim(x, tuple(shape), tuple(dims))
    if x is a:
        raise NoDecomposition  # a[...] or a[:] is the tensor itself
    return x


register_torch_op("getitem", T.__getitem__, decomposition=_getitem)


def _gather(a, dim, index, *, sparse_grad=False, out=None):
    if out is not None:
        raise NoDecomposition
    return prims.gather(a, canonical_dim(dim, a.ndim), index)


register_torch_op("gather", torch.gather, T.gather, decomposition=_gather)


def _scatter(a, dim, index, src=None, *, value=None, reduce=None, out=None):
    if out is not None or reduce is not None:
        raise NoDecomposition
    source = src if src is not None else value
    return prims.scatter(a, canonical_dim(dim, a.ndim), index, source)


register_torch_op("scatter", torch.scatter, T.scatter, decomposition=_scatter)


def _scatter_add(a, dim, index, src):
    return prims.scatter_add(a, canonical_dim(dim, a.ndim), index, src)


register_torch_op("scatter_add", torch.scatter_add, T.scatter_add, decomposition=_scatter_add)


def _index_select(a, dim, index, *, out=None):
    if out is not None or index.ndim != 1:
        raise NoDecomposition
    return prims.take(a, index, canonical_dim(dim, a.ndim))


register_torch_op("index_select", torch.index_select, T.index_select, decomposition=_index_select)


register_torch_op("index_add", torch.index_add, T.index_add)
