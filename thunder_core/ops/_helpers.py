"""Shared pieces of the torch-level decompositions: type promotion, broadcasting, dims."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes, get_computation_dtype

from thunder_core.ir.symbolic import same_sizes
from thunder_core.ir.symbols import active_recorder
from thunder_core.ops import kept_answers, prims

__all__ = [
    "Kind",
    "NoDecomposition",
    "broadcast_to",
    "canonical_dim",
    "canonical_dims",
    "LOW_PRECISION",
    "convert",
    "in_float32",
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


LOW_PRECISION = (torch.float16, torch.bfloat16)


def in_float32(x):
    """A float16/bfloat16 tensor as float32 (what eager's kernels compute such tensors in);
    anything else as it is."""
    return convert(x, torch.float32) if is_tensor(x) and x.dtype in LOW_PRECISION else x


_broadcasts: dict[tuple, tuple[int, ...]] = {}


def shape_of_broadcast(*xs) -> tuple[int, ...]:
    """The shape the tensors among ``xs`` broadcast to (``torch.broadcast_shapes``; for plain
    sizes memoized and kept on disk: PyTorch's imports sympy on first use)."""
    shapes = tuple(tuple(x.shape) for x in xs if is_tensor(x))
    if not all(type(size) is int for shape in shapes for size in shape):  # symbolic sizes
        return tuple(torch.broadcast_shapes(*shapes))
    if len(set(shapes)) <= 1:  # nothing to broadcast (PyTorch's rule imports sympy on first use)
        return shapes[0] if shapes else ()
    answer = _broadcasts.get(shapes)
    if answer is None:
        question = repr(("broadcast", shapes))
        kept = kept_answers.lookup(question)
        if isinstance(kept, tuple) and all(type(size) is int for size in kept):
            answer = kept
        else:
            answer = tuple(torch.broadcast_shapes(*shapes))
            kept_answers.remember(question, answer)
        if len(_broadcasts) < 10_000:
            _broadcasts[shapes] = answer
    return answer


def broadcast_to(x, shape):
    if not is_tensor(x) or same_sizes(x.shape, shape):
        return x
    offset = len(shape) - x.ndim
    if any(size != 1 and size != shape[offset + i] for i, size in enumerate(x.shape)):
        raise RuntimeError(f"cannot broadcast {tuple(x.shape)} to {tuple(shape)}")
    return prims.broadcast_in_dim(x, tuple(shape), tuple(range(offset, len(shape))))


_promotions: dict[tuple, tuple[torch.dtype, torch.dtype]] = {}
_NUMBERS = (bool, int, float, complex)


def promote(*xs, kind: Kind) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) by PyTorch's elementwise type promotion.

    Memoized on what the answer depends on (dtypes, which tensors are zero-dim, which Python
    number types, the default dtype) and kept on disk for later processes
    (``thunder_core.ops.kept_answers``): PyTorch's promotion imports sympy on first use."""
    same = _one_dtype(xs, kind)
    if same is not None:
        return same
    key = _promotion_key(xs, kind)
    if key is None:
        return elementwise_dtypes(*xs, type_promotion_kind=kind)
    answer = _promotions.get(key)
    if answer is None:
        question = repr(("promote", *key))
        kept = kept_answers.lookup(question)
        if isinstance(kept, tuple) and len(kept) == 2 and all(isinstance(d, torch.dtype) for d in kept):
            answer = kept
        else:
            answer = tuple(elementwise_dtypes(*xs, type_promotion_kind=kind))
            kept_answers.remember(question, answer)
        _promotions[key] = answer
    return answer


_PLAIN_INTEGERS = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}
)


def _one_dtype(xs, kind: Kind) -> tuple[torch.dtype, torch.dtype] | None:
    """The promotion of tensors that all have one dtype (no Python numbers), by the default
    kind: that dtype, computed in PyTorch's computation dtype for it (float32 for half types);
    None otherwise."""
    if kind is not Kind.DEFAULT:
        return None
    dtype = None
    for x in xs:
        if x is None:
            continue
        if not is_tensor(x) or (dtype is not None and x.dtype != dtype):
            return None
        dtype = x.dtype
    if dtype is None or not (dtype.is_floating_point or dtype.is_complex or dtype in _PLAIN_INTEGERS):
        return None  # quantized and bit types: PyTorch's rule refuses them, and says so
    return get_computation_dtype(dtype), dtype


def _promotion_key(xs, kind: Kind) -> tuple | None:
    parts = []
    for x in xs:
        if x is None:
            continue
        if is_tensor(x):
            parts.append((str(x.dtype), x.ndim == 0))
        elif type(x) in _NUMBERS:
            parts.append(type(x).__name__)
        else:  # a symbolic number, or something PyTorch will refuse: asked every time
            return None
    return (kind.name, str(torch.get_default_dtype()), tuple(parts))
