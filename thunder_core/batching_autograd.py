"""Batching the operations a gradient differentiates with PyTorch autograd (no VJP rule).

The autograd fallback's forward keeps autograd's graph in a handle that its backward reads;
``torch.func.vmap`` cannot run either (autograd's graph is no functorch transform). Under
``vmap`` the pair becomes: the op itself (batched like any other), and for the backward
``torch.func.vjp`` of the op at the same inputs, mapped by ``torch.func.vmap``
(``torch_func_vmap_vjp`` in the trace): the op runs once more in the backward, the price of an
op without a VJP rule of thunder_core's.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from thunder_core.capture.torch_vmap import original_vmap
from thunder_core.ir.symbols import Symbol, active_recorder
from thunder_core.ir.tree import leaves, tree_map

_SLOT = "<slot>"


class PendingBackward:
    """What a batched fallback forward leaves for its backward: the op and its (replayed)
    arguments, and which leaves are differentiated."""

    def __init__(self, fn, args, kwargs, differentiable: tuple, handle):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.differentiable = differentiable
        self.handle = handle  # the unbatched forward's real handle, for an unbatched backward


class VjpOfOp:
    """``(*leaves of (args, kwargs), *output gradients) -> gradients of the differentiated
    leaves``, by ``torch.func.vjp`` of ``fn``."""

    def __init__(self, fn, skeleton, positions: tuple, count: int):
        self.fn, self.skeleton, self.positions, self.count = fn, skeleton, positions, count

    def __call__(self, *values):
        flat, grads = list(values[: self.count]), values[self.count :]

        def at(*differentiated):
            for i, value in zip(self.positions, differentiated):
                flat[i] = value
            remaining = iter(flat)
            args, kwargs = tree_map(lambda _: next(remaining), self.skeleton)
            return self.fn(*args, **kwargs)

        out, pullback = torch.func.vjp(at, *(flat[i] for i in self.positions))
        outs, spec = pytree.tree_flatten(out)
        cotangents = [
            torch.zeros_like(o) if g is None else g for o, g in zip(outs, (*grads, *([None] * len(outs))))
        ]
        return tuple(pullback(pytree.tree_unflatten(cotangents, spec)))

    def __repr__(self) -> str:
        return f"vjp_of({getattr(self.fn, '__name__', self.fn)})"


def _impl(name, fn, in_dims, randomness, args):
    return original_vmap()(fn, in_dims=in_dims, randomness=randomness)(*args)


def _meta(name, fn, in_dims, randomness, args):
    # The gradients are shaped like the differentiated leaves, the batch in front
    recorder = active_recorder()
    size = next(x.shape[0] for x, d in zip(args, in_dims) if d is not None)
    out = []
    for i in fn.positions:
        x = args[i]
        shape = tuple(x.shape) if in_dims[i] is not None else (size, *x.shape)
        out.append(recorder.new_proxy(shape, x.dtype, x.device, False, None))
    return tuple(out)


#: The backward of an op without a VJP rule, under ``vmap``: torch.func.vjp of the op, mapped.
torch_func_vmap_vjp = Symbol(
    name="torch_func_vmap_vjp", impl=_impl, printed_name="torch_func_vmap_vjp", meta=_meta
)


def batched_backward(batcher, pending: PendingBackward, grads: tuple):
    """The backward of a fallback forward replayed under ``vmap``, as one mapped ``torch.func.vjp``."""
    flat = list(leaves((pending.args, pending.kwargs)))
    skeleton = tree_map(lambda _: _SLOT, (pending.args, pending.kwargs))
    positions = tuple(i for i, d in enumerate(pending.differentiable) if d)
    fn = VjpOfOp(pending.fn, skeleton, positions, len(flat))
    values = (*flat, *grads)
    in_dims = tuple(0 if batcher.is_batched(x) else None for x in values)
    if not any(d is not None for d in in_dims):
        return None
    return torch_func_vmap_vjp(
        f"vjp of {getattr(pending.fn, '__name__', 'op')}", fn, in_dims, batcher.randomness, values
    )
