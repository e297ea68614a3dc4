"""Batching rules for the prims: what ``vmap`` replays when an operation without a rule of its own
is batched through its decomposition.

Prims take one example's shapes, dims and index ranges written out; each rule writes them for
the batch, which is always dimension 0 (dims move up by one, shapes and ranges gain the batch in
front). Elementwise prims take tensors of one shape, so a tensor that is the same for every
example is broadcast along the batch first. A rule returns None to decline (the prim then runs
through ``torch.func.vmap`` on its own).
"""

from __future__ import annotations

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.tree import leaves, tree_map
from thunder_core.ops import prims as P

ELEMENTWISE_PRIMS = frozenset(
    """abs neg exp exp2 expm1 log log1p log2 log10 sin cos tan asin acos atan sinh cosh tanh asinh acosh
    atanh sqrt rsqrt reciprocal erf erfc erfinv floor ceil round trunc sign signbit isnan isinf isfinite
    logical_not bitwise_not lgamma digamma sigmoid add sub mul div remainder fmod pow maximum minimum atan2
    eq ne lt le gt ge bitwise_and bitwise_or bitwise_xor shift_left shift_right copysign where
    convert_element_type device_put""".split()
)


def _batched_copy(batcher, x):
    """``x`` (the same for every example) broadcast along the batch."""
    out = P.broadcast_in_dim(x, (batcher.size, *x.shape), tuple(range(1, x.ndim + 1)))
    batcher.batched.add(id(out))
    return out


def _every_tensor_batched(batcher, tree):
    return tree_map(
        lambda x: (
            _batched_copy(batcher, x) if isinstance(x, TensorProxy) and not batcher.is_batched(x) else x
        ),
        tree,
    )


def _first_alone_batched(batcher, args) -> bool:
    return batcher.is_batched(args[0]) and not any(batcher.is_batched(x) for x in leaves(args[1:]))


def _dim(x, dim: int) -> int:
    """One example's dim of batched ``x`` as a dim of the batch."""
    return dim % (x.ndim - 1) + 1 if x.ndim > 1 else dim + 1


def _example_shape(batcher, x) -> tuple:
    return tuple(x.shape[1:]) if batcher.is_batched(x) else tuple(x.shape)


def _elementwise(symbol, batcher, args, kwargs):
    tensors = [x for x in leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    if len({_example_shape(batcher, x) for x in tensors}) != 1:
        return None  # prims take tensors of one shape; anything else is left to torch.func
    return symbol(*_every_tensor_batched(batcher, args), **_every_tensor_batched(batcher, kwargs))


def _broadcast_in_dim(symbol, batcher, args, kwargs):
    if kwargs or not _first_alone_batched(batcher, args):
        return None
    a, shape, dims = args
    return symbol(a, (batcher.size, *shape), (0, *(d + 1 for d in dims)))


def _reshape(symbol, batcher, args, kwargs):
    if kwargs or not _first_alone_batched(batcher, args):
        return None
    return symbol(args[0], (batcher.size, *args[1]))


def _permute(symbol, batcher, args, kwargs):
    if kwargs or not _first_alone_batched(batcher, args):
        return None
    return symbol(args[0], (0, *(_dim(args[0], d) for d in args[1])))


def _with_dims(position: int, none_is_identity: bool = False):
    """Prims with a tuple of dims (or one dim) at ``position``: squeeze, flip, the reductions.
    No dims at all is allowed where the prim then changes nothing (``none_is_identity``: sum,
    amax, ...; ``var`` over no dims reduces over all of them, the batch included)."""

    def rule(symbol, batcher, args, kwargs):
        if kwargs or len(args) <= position or not _first_alone_batched(batcher, args):
            return None
        dims = args[position]
        if dims in ((), []) and not none_is_identity:
            return None
        if args[0].ndim == 1 and dims not in ((), []):
            return None  # one number per example: a dim could name it as 0 or -1
        if isinstance(dims, int) and not isinstance(dims, bool):
            shifted = _dim(args[0], dims)
        elif isinstance(dims, (tuple, list)) and all(isinstance(d, int) for d in dims):
            shifted = type(dims)(_dim(args[0], d) for d in dims)
        else:
            return None
        return symbol(*args[:position], shifted, *args[position + 1 :])

    return rule


def _slice(symbol, batcher, args, kwargs):
    if kwargs or not _first_alone_batched(batcher, args):
        return None
    a, start, end, *rest = args
    strides = rest[0] if rest and rest[0] is not None else [1] * len(start)
    return symbol(a, [0, *start], [batcher.size, *end], [1, *strides])


def _cat(symbol, batcher, args, kwargs):
    if kwargs or len(args) != 2 or not isinstance(args[1], int):
        return None
    tensors, dim = args
    example_rank = tensors[0].ndim - (1 if batcher.is_batched(tensors[0]) else 0)
    return symbol(list(_every_tensor_batched(batcher, list(tensors))), dim % example_rank + 1)


def _take(symbol, batcher, args, kwargs):
    if kwargs or not _first_alone_batched(batcher, args):
        return None
    a, index, dim = args
    return symbol(a, index, _dim(a, dim))


def _gather_or_scatter(symbol, batcher, args, kwargs):
    """``gather(a, dim, index)``, ``scatter(a, dim, index, src)``: the index has the input's rank,
    so every tensor takes the batch."""
    if kwargs or not isinstance(args[1], int):
        return None
    a = args[0]
    rank = a.ndim - (1 if batcher.is_batched(a) else 0)
    if rank == 0:
        return None
    return symbol(
        *_every_tensor_batched(batcher, (a,)), args[1] % rank + 1, *_every_tensor_batched(batcher, args[2:])
    )


def _matmul(symbol, batcher, args, kwargs):
    """``matmul`` as torch.matmul: a batched operand of rank 2 or more per example keeps the batch
    leading; vectors take the batch through a unit dimension."""
    if kwargs or len(args) != 2:
        return None
    a, b = args
    ra = a.ndim - (1 if batcher.is_batched(a) else 0)
    rb = b.ndim - (1 if batcher.is_batched(b) else 0)
    if batcher.is_batched(a) and not batcher.is_batched(b) and rb <= 2 and ra >= 1:
        return symbol(a, b)
    if ra < 2 or rb < 2:
        return None
    rank = max(ra, rb)

    def lifted(x, r):
        """A batched operand with unit dims after the batch up to the other's rank, so the batch
        never broadcasts against the other's leading dims; the same for every example: as it is."""
        if not batcher.is_batched(x) or r == rank:
            return x
        out = P.reshape(x, (x.shape[0], *([1] * (rank - r)), *x.shape[1:]))
        batcher.batched.add(id(out))
        return out

    return symbol(lifted(a, ra), lifted(b, rb))


PRIM_RULES = {f"prims.{name}": _elementwise for name in ELEMENTWISE_PRIMS}
PRIM_RULES.update(
    {
        "prims.broadcast_in_dim": _broadcast_in_dim,
        "prims.reshape": _reshape,
        "prims.permute": _permute,
        "prims.squeeze": _with_dims(1, none_is_identity=True),
        "prims.flip": _with_dims(1, none_is_identity=True),
        "prims.sum": _with_dims(1, none_is_identity=True),
        "prims.prod": _with_dims(1, none_is_identity=True),
        "prims.amax": _with_dims(1, none_is_identity=True),
        "prims.amin": _with_dims(1, none_is_identity=True),
        "prims.var": _with_dims(1),
        "prims.cumsum": _with_dims(1),
        "prims.argmax": _with_dims(1),
        "prims.argmin": _with_dims(1),
        "prims.topk": _with_dims(2),
        "prims.slice": _slice,
        "prims.cat": _cat,
        "prims.take": _take,
        "prims.gather": _gather_or_scatter,
        "prims.scatter": _gather_or_scatter,
        "prims.scatter_add": _gather_or_scatter,
        "prims.matmul": _matmul,
    }
)
