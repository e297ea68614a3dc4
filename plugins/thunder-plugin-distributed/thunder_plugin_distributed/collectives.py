"""The collectives as thunder_core symbols, run on torch.distributed.

Each communication is a pair of symbols: ``*_start`` issues the torch.distributed collective
with ``async_op=True`` and returns a handle; ``*_wait`` waits for it and returns the result.
Autodiff records both next to each other; ``schedule.schedule_collectives`` then moves every
start as early and every wait as late as the data allows, so communication overlaps compute.

- ``ddp_synchronize(p, group)``: the identity in the forward; its gradient is averaged across
  the group (``ddp_all_reduce_start`` / ``ddp_all_reduce_wait``, one bucket of gradients each).
- ``fsdp_all_gather(shard, rows, group)``: the full parameter from the shards of every rank
  (padding dropped); its gradient is reduce-scattered and averaged back onto the shard
  (``fsdp_reduce_scatter_start`` / ``fsdp_reduce_scatter_wait``). Tagged ``RECOMPUTE`` for
  ZeRO-3 (``fsdp_all_gather_again``), so the backward gathers again instead of the forward
  keeping the full parameter.

Process groups are not values a trace can print: a symbol takes the small integer key under
which ``register_group`` keeps the group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from thunder_core.extend import RECOMPUTE, Symbol, new_object_proxy, new_tensor_proxy

_GROUPS: dict[int, object] = {}


def register_group(group) -> int:
    """A key for ``group`` (None: the default group) that symbols take in place of the group."""
    for key, known in _GROUPS.items():
        if known is group:
            return key
    key = len(_GROUPS)
    _GROUPS[key] = group
    return key


def group_of(key: int):
    return _GROUPS[key]


def world_size(key: int) -> int:
    return dist.get_world_size(_GROUPS[key])


def rank(key: int) -> int:
    return dist.get_rank(_GROUPS[key])


@dataclass
class Pending:
    """An issued collective: its work handle and the buffers it reads and writes."""

    work: object
    result: torch.Tensor
    source: torch.Tensor | None = None  # kept alive until the work is done


def _all_gather(output: torch.Tensor, shard: torch.Tensor, group, async_op: bool):
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, shard, group=group, async_op=async_op)


def _reduce_scatter(output: torch.Tensor, source: torch.Tensor, group, async_op: bool):
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, source, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


# --- DDP: identity forward, averaged gradient -------------------------------------------------


def _synchronize_impl(parameter: torch.Tensor, group: int) -> torch.Tensor:
    return parameter


def _synchronize_meta(parameter, group: int):
    return new_tensor_proxy(
        parameter.shape, parameter.dtype, parameter.device, parameter.requires_grad, parameter.stride()
    )


def _all_reduce_start_impl(grads: tuple, group: int) -> Pending:
    size = world_size(group)
    if len(grads) == 1:
        buffer = grads[0].div(size).contiguous()
    else:
        buffer = torch.cat([g.reshape(-1) for g in grads]).div_(size)
    work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group_of(group), async_op=True)
    return Pending(work, buffer)


def _all_reduce_start_meta(grads: tuple, group: int):
    return new_object_proxy()


def _all_reduce_wait_impl(pending: Pending, shapes: tuple) -> tuple:
    pending.work.wait()
    buffer = pending.result
    if len(shapes) == 1:
        return (buffer.view(shapes[0]),)
    sizes = [math.prod(shape) for shape in shapes]
    return tuple(part.view(shape) for part, shape in zip(torch.split(buffer, sizes), shapes))


def _ddp_wait_meta(pending, shapes: tuple, dtype: torch.dtype, device: torch.device):
    return tuple(new_tensor_proxy(shape, dtype, device) for shape in shapes)


def _ddp_wait_impl(pending: Pending, shapes: tuple, dtype: torch.dtype, device: torch.device) -> tuple:
    return _all_reduce_wait_impl(pending, shapes)


ddp_all_reduce_start = Symbol(
    "ddp_all_reduce_start", _all_reduce_start_impl, "ddp_all_reduce_start", meta=_all_reduce_start_meta
)
ddp_all_reduce_wait = Symbol(
    "ddp_all_reduce_wait", _ddp_wait_impl, "ddp_all_reduce_wait", meta=_ddp_wait_meta
)


def _synchronize_vjp(parameter, group: int):
    out = ddp_synchronize(parameter, group)

    def backward(grad):
        handle = ddp_all_reduce_start((grad,), group)
        (averaged,) = ddp_all_reduce_wait(handle, (tuple(grad.shape),), grad.dtype, grad.device)
        return [(parameter, averaged)]

    return out, backward


ddp_synchronize = Symbol(
    "ddp_synchronize", _synchronize_impl, "ddp_synchronize", meta=_synchronize_meta, vjp=_synchronize_vjp
)


# --- FSDP: gather the shards, reduce-scatter the gradient --------------------------------------


def _gather_start_impl(shard: torch.Tensor, group: int) -> Pending:
    size = world_size(group)
    shard = shard.contiguous()
    output = torch.empty((shard.shape[0] * size, *shard.shape[1:]), dtype=shard.dtype, device=shard.device)
    work = _all_gather(output, shard, group_of(group), async_op=True)
    return Pending(work, output, shard)


def _gather_start_meta(shard, group: int):
    return new_object_proxy()


def _gather_wait_impl(pending: Pending, rows: int) -> torch.Tensor:
    pending.work.wait()
    return pending.result[:rows]


def _gather_wait_meta(pending, rows: int, like_shape: tuple, dtype, device, requires_grad: bool):
    return new_tensor_proxy((rows, *like_shape[1:]), dtype, device, requires_grad)


def _gather_wait(pending: Pending, rows: int, like_shape: tuple, dtype, device, requires_grad: bool):
    return _gather_wait_impl(pending, rows)


def _gather_impl(shard: torch.Tensor, rows: int, group: int) -> torch.Tensor:
    return _gather_wait_impl(_gather_start_impl(shard, group), rows)


def _gather_meta(shard, rows: int, group: int):
    return new_tensor_proxy((rows, *shard.shape[1:]), shard.dtype, shard.device, shard.requires_grad)


def _reduce_scatter_start_impl(grad: torch.Tensor, shard_rows: int, group: int) -> Pending:
    size = world_size(group)
    source = torch.zeros((shard_rows * size, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
    source[: grad.shape[0]].copy_(grad)
    output = torch.empty((shard_rows, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
    work = _reduce_scatter(output, source, group_of(group), async_op=True)
    return Pending(work, output, source)


def _reduce_scatter_start_meta(grad, shard_rows: int, group: int):
    return new_object_proxy()


def _reduce_scatter_wait_impl(pending: Pending, shape: tuple, dtype, device, group: int) -> torch.Tensor:
    pending.work.wait()
    return pending.result.div_(world_size(group))


def _reduce_scatter_wait_meta(pending, shape: tuple, dtype, device, group: int):
    return new_tensor_proxy(shape, dtype, device)


fsdp_all_gather_start = Symbol(
    "fsdp_all_gather_start", _gather_start_impl, "fsdp_all_gather_start", meta=_gather_start_meta
)
fsdp_all_gather_wait = Symbol(
    "fsdp_all_gather_wait", _gather_wait, "fsdp_all_gather_wait", meta=_gather_wait_meta
)
fsdp_reduce_scatter_start = Symbol(
    "fsdp_reduce_scatter_start",
    _reduce_scatter_start_impl,
    "fsdp_reduce_scatter_start",
    meta=_reduce_scatter_start_meta,
)
fsdp_reduce_scatter_wait = Symbol(
    "fsdp_reduce_scatter_wait",
    _reduce_scatter_wait_impl,
    "fsdp_reduce_scatter_wait",
    meta=_reduce_scatter_wait_meta,
)


def _gather_vjp_for(symbol_name: str):
    def vjp(shard, rows: int, group: int):
        out = GATHERS[symbol_name](shard, rows, group)

        def backward(grad):
            handle = fsdp_reduce_scatter_start(grad, shard.shape[0], group)
            reduced = fsdp_reduce_scatter_wait(handle, tuple(shard.shape), grad.dtype, grad.device, group)
            return [(shard, reduced)]

        return out, backward

    return vjp


#: The gather of ZeRO-2 (the forward keeps the full parameter for the backward) and of ZeRO-3
#: (the backward gathers it again).
GATHERS = {
    "fsdp_all_gather": Symbol(
        "fsdp_all_gather",
        _gather_impl,
        "fsdp_all_gather",
        meta=_gather_meta,
        vjp=_gather_vjp_for("fsdp_all_gather"),
    ),
    "fsdp_all_gather_again": Symbol(
        "fsdp_all_gather_again",
        _gather_impl,
        "fsdp_all_gather_again",
        meta=_gather_meta,
        tags=frozenset({RECOMPUTE}),
        vjp=_gather_vjp_for("fsdp_all_gather_again"),
    ),
}

STARTS = frozenset(
    {"ddp_all_reduce_start", "fsdp_all_gather_start", "fsdp_reduce_scatter_start", "tp_all_reduce_start"}
)
WAITS = frozenset(
    {"ddp_all_reduce_wait", "fsdp_all_gather_wait", "fsdp_reduce_scatter_wait", "tp_all_reduce_wait"}
)
