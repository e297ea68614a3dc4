"""The collectives of tensor parallelism as thunder_core symbols, with their VJPs.

Megatron-LM's two conjugate operators on the activations of a tensor-parallel group:

- ``tp_copy(x, group)``: the identity in the forward, where a replicated activation enters a
  column-parallel layer; its gradient is summed over the group (each rank's layer saw ``x`` and
  contributes its part of the gradient).
- ``tp_all_reduce(x, group)``: the sum over the group in the forward, where a row-parallel
  layer's partial results meet; the identity in the backward (the gradient of the sum, replicated
  on every rank, is each part's gradient).

Both run synchronously on torch.distributed (the group by its ``register_group`` key). Called
outside a trace (a tensor-parallel module run eagerly), they are ``torch.autograd.Function``s
with the same gradients, so eager training of the transformed module is right too.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from thunder_core.extend import Symbol, new_tensor_proxy
from thunder_plugin_distributed.collectives import group_of


def _like(x):
    return new_tensor_proxy(x.shape, x.dtype, x.device, x.requires_grad)


def _summed(x: torch.Tensor, group: int) -> torch.Tensor:
    out = x.detach().contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group_of(group))
    return out


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
