"""The collectives of tensor parallelism as thunder_core symbols, with their VJPs.

Megatron-LM's two conjugate operators on the activations of a tensor-parallel group:

- ``tp_copy(x, group)``: the identity in the forward, where a replicated activation enters a
  column-parallel layer; its gradient is summed over the group (each rank's layer saw ``x`` and
  contributes its part of the gradient).
- ``tp_all_reduce(x, group)``: the sum over the group in the forward, where a row-parallel
  layer's partial results meet; the identity in the backward (the gradient of the sum, replicated
  on every rank, is each part's gradient).

Called outside a trace (a tensor-parallel module run eagerly), they are
``torch.autograd.Function``s with the same gradients, so eager training of the transformed
module is right too. In an executed trace the schedule pass (``schedule.schedule_collectives``)
splits each ``tp_all_reduce`` into ``tp_all_reduce_start`` (issued with ``async_op=True`` as soon
as its input exists) and ``tp_all_reduce_wait`` (right before the first use of the sum), so the
sum of the input gradients in the backward overlaps the weight gradients' matmuls.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from thunder_core.extend import Symbol, new_object_proxy, new_tensor_proxy
from thunder_plugin_distributed.collectives import Pending, group_of, rank, world_size


def _like(x):
    return new_tensor_proxy(x.shape, x.dtype, x.device, x.requires_grad)


def _summed(x: torch.Tensor, group: int) -> torch.Tensor:
    return _sum_wait(_sum_start(x, group), None, None, None)


def _sum_start(x: torch.Tensor, group: int) -> Pending:
    """Issue the sum of ``x`` over the group (on a copy) without waiting for it."""
    buffer = x.detach().contiguous().clone()
    work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group_of(group), async_op=True)
    return Pending(work, buffer)


def _sum_wait(pending: Pending, shape, dtype, device) -> torch.Tensor:
    pending.work.wait()
    return pending.result


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _summed(grad, ctx.group), None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _summed(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _copy_impl(x: torch.Tensor, group: int) -> torch.Tensor:
    return _Copy.apply(x, group) if torch.is_grad_enabled() and x.requires_grad else x


def _all_reduce_impl(x: torch.Tensor, group: int) -> torch.Tensor:
    return _AllReduce.apply(x, group) if torch.is_grad_enabled() and x.requires_grad else _summed(x, group)


def _copy_vjp(x, group: int):
    out = tp_copy(x, group)

    def backward(grad):
        return [(x, tp_all_reduce(grad, group))]

    return out, backward


def _all_reduce_vjp(x, group: int):
    out = tp_all_reduce(x, group)

    def backward(grad):
        return [(x, grad)]

    return out, backward


tp_copy = Symbol("tp_copy", _copy_impl, "tp_copy", meta=lambda x, group: _like(x), vjp=_copy_vjp)
tp_all_reduce = Symbol(
    "tp_all_reduce", _all_reduce_impl, "tp_all_reduce", meta=lambda x, group: _like(x), vjp=_all_reduce_vjp
)


tp_all_reduce_start = Symbol(
    "tp_all_reduce_start",
    _sum_start,
    "tp_all_reduce_start",
    meta=lambda x, group: new_object_proxy(),
)
tp_all_reduce_wait = Symbol(
    "tp_all_reduce_wait",
    _sum_wait,
    "tp_all_reduce_wait",
    meta=lambda pending, shape, dtype, device: new_tensor_proxy(shape, dtype, device),
)


# --- Sequence parallelism: activations between the layers split along the sequence (dim 1) -----

SEQUENCE_DIM = 1


def _gathered(x: torch.Tensor, group: int) -> torch.Tensor:
    """The group's parts of ``x`` concatenated along the sequence, in rank order."""
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world_size(group))]
    dist.all_gather(parts, x.detach().contiguous(), group=group_of(group))
    return torch.cat(parts, dim=SEQUENCE_DIM)


def _scattered(x: torch.Tensor, group: int) -> torch.Tensor:
    """This rank's part, along the sequence, of the sum of ``x`` over the group."""
    size = world_size(group)
    moved = x.detach().movedim(SEQUENCE_DIM, 0).contiguous()
    out = torch.empty((moved.shape[0] // size, *moved.shape[1:]), dtype=x.dtype, device=x.device)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, moved, op=dist.ReduceOp.SUM, group=group_of(group))
    return out.movedim(0, SEQUENCE_DIM)


def _part(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.detach().chunk(world_size(group), dim=SEQUENCE_DIM)[rank(group)].contiguous()


def _resized(x, group: int, factor_up: bool):
    shape = list(x.shape)
    size = world_size(group)
    shape[SEQUENCE_DIM] = shape[SEQUENCE_DIM] * size if factor_up else shape[SEQUENCE_DIM] // size
    return new_tensor_proxy(tuple(shape), x.dtype, x.device, x.requires_grad)


def _sequence_symbol(name: str, forward, grow: bool, backward_name: str):
    """A symbol whose forward is ``forward`` and whose VJP applies the symbol ``backward_name``."""

    class _Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return forward(x, group)

        @staticmethod
        def backward(ctx, grad):
            return _SEQUENCE[backward_name].impl(grad, ctx.group), None

    def impl(x, group: int):
        if torch.is_grad_enabled() and x.requires_grad:
            return _Eager.apply(x, group)
        return forward(x, group)

    def vjp(x, group: int):
        out = _SEQUENCE[name](x, group)

        def backward(grad):
            return [(x, _SEQUENCE[backward_name](grad, group))]

        return out, backward

    return Symbol(name, impl, name, meta=lambda x, group: _resized(x, group, grow), vjp=vjp)


_SEQUENCE: dict[str, Symbol] = {}
#: Into the sequence-parallel region: this rank's part of a replicated activation (gradient: gathered).
_SEQUENCE["tp_split_sequence"] = _sequence_symbol("tp_split_sequence", _part, False, "tp_gather_sequence")
#: Out of it (before the output head): the whole sequence (gradient: this rank's part).
_SEQUENCE["tp_gather_sequence"] = _sequence_symbol("tp_gather_sequence", _gathered, True, "tp_split_sequence")
#: Into a column-parallel layer: the whole sequence (gradient: summed and scattered back).
_SEQUENCE["tp_all_gather_sequence"] = _sequence_symbol(
    "tp_all_gather_sequence", _gathered, True, "tp_reduce_scatter_sequence"
)
#: Out of a row-parallel layer: the sum over the group, this rank's part of the sequence (gradient: gathered).
_SEQUENCE["tp_reduce_scatter_sequence"] = _sequence_symbol(
    "tp_reduce_scatter_sequence", _scattered, False, "tp_all_gather_sequence"
)
tp_split_sequence = _SEQUENCE["tp_split_sequence"]
tp_gather_sequence = _SEQUENCE["tp_gather_sequence"]
tp_all_gather_sequence = _SEQUENCE["tp_all_gather_sequence"]
tp_reduce_scatter_sequence = _SEQUENCE["tp_reduce_scatter_sequence"]
