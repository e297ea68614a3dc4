"""Shared pieces of the torch-level decompositions: type promotion, broadcasting, dims."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from thunder_core.ir.symbols import active_recorder
from thunder_core.ops import prims

__all__ = [
    "Kind",
    "NoDecomposition",
    "broadcast_to",
    "canonical_dim",
    "canonical_dims",
    "convert",
    "is_tensor",
    "new_proxy",
    "promote",
    "shape_of_broadcast",
]


class NoDecomposition(Exception):
    """Raised by a decomposition for a call form it does not cover; the op stays a leaf."""


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def new_proxy(shape, dtype, device, requires_grad=False, strides=None):
    """A fresh proxy in the trace being captured (for hand-written meta functions)."""
    return active_recorder().new_proxy(shape, dtype, device, requires_grad, strides)


def canonical_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"dimension {dim} out of range for a tensor with {ndim} dims")
    return dim % n


def canonical_dims(dims, ndim: int) -> tuple[int, ...]:
    """None or [] -> every dim; an int or a sequence -> sorted non-negative dims."""
    if dims is None or (isinstance(dims, Sequence) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted({canonical_dim(d, ndim) for d in dims})) if ndim else ()


def convert(x, dtype: torch.dtype):
    """``x`` in ``dtype``: a prim conversion for tensors, left alone for Python numbers."""
    if is_tensor(x) and x.dtype != dtype:
        return prims.convert_element_type(x, dtype)
    return x


def shape_of_broadcast(*xs) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*(tuple(x.shape) for x in xs if is_tensor(x))))


def broadcast_to(x, shape):
    if not is_tensor(x) or tuple(x.shape) == tuple(shape):
        return x
    offset = len(shape) - x.ndim
    if any(size != 1 and size != shape[offset + i] for i, size in enumerate(x.shape)):
        raise RuntimeError(f"cannot broadcast {tuple(x.shape)} to {tuple(shape)}")
    return prims.broadcast_in_dim(x, tuple(shape), tuple(range(offset, len(shape))))


def promote(*xs, kind: Kind) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) by PyTorch's elementwise type promotion."""
    return elementwise_dtypes(*xs, type_promotion_kind=kind)
