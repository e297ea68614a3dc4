"""``ddp``: data parallel training with gradients averaged in the backward trace.

At wrap time every rank takes the first rank's parameters and buffers. While the forward is
captured each parameter that requires grad passes through ``ddp_synchronize`` (the identity),
so autodiff puts an averaging all-reduce of its gradient into the backward trace; the
``schedule_collectives`` pass merges those into buckets and overlaps them with the backward.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from thunder_core.extend import ModuleExtension, TensorProxy
from thunder_plugin_distributed.collectives import ddp_synchronize, group_of
from thunder_plugin_distributed.common import (
    broadcast_from_first_rank,
    claim_module,
    data_parallel_group,
    record_extension,
    unique_tensors,
)
from thunder_plugin_distributed.teardown import release_at_exit


class DDPExtension(ModuleExtension):
    """The ``ddp`` plugin's view of one jitted module."""

    name = "ddp"

    def __init__(self, module: nn.Module, group: int, bucket_size_mb: int):
        self.module = module
        self.group = group
        self.bucket_size_mb = bucket_size_mb
        self.sync = True

    def bind(self, names: list[str], proxies: list) -> list:
        if not self.sync:
            return proxies
        synchronized: dict[int, object] = {}
        out = []
        for proxy in proxies:
            if isinstance(proxy, TensorProxy) and proxy.requires_grad:
                if id(proxy) not in synchronized:
                    synchronized[id(proxy)] = ddp_synchronize(proxy, self.group)
                out.append(synchronized[id(proxy)])
            else:
                out.append(proxy)
        return out

    def cache_key(self):
        return self.sync

    def describe(self) -> dict[str, str]:
        return {"ddp gradient sync": "on" if self.sync else "off (no_sync)"}

    @contextmanager
    def no_sync(self):
        """Backward passes inside keep their gradients local (accumulated in ``.grad``); leaving
        the outermost ``no_sync`` averages the accumulated ``.grad`` across ranks, so the next
        synchronized backward ends with the same gradients as DistributedDataParallel's."""
        outermost = self.sync
        self.sync = False
        try:
            yield
        finally:
            self.sync = outermost
        if outermost:
            average_gradients(self.module.parameters(), self.group)


@torch.no_grad()
def average_gradients(parameters, group_key: int) -> None:
    """Average ``.grad`` across the group; a gradient present on some ranks only counts as zeros elsewhere."""
    group = group_of(group_key)
    params = [p for p in unique_tensors(parameters) if p.requires_grad]
    if not params:
        return
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
    dist.all_reduce(present, op=dist.ReduceOp.MAX, group=group)
    chosen = [p for p, any_rank in zip(params, present.tolist()) if any_rank]
    for p in chosen:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    size = dist.get_world_size(group)
    by_kind: dict[tuple, list] = {}
    for p in chosen:
        by_kind.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for same in by_kind.values():
        flat = torch.cat([p.grad.reshape(-1) for p in same])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat.div_(size)
        offset = 0
        for p in same:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def ddp_transform(module: nn.Module, options: dict) -> DDPExtension:
    """Broadcast the first rank's parameters and buffers; gradients are averaged in the backward."""
    claim_module(module, "ddp")
    group = data_parallel_group(module)
    release_at_exit()
    if options["broadcast"]:
        broadcast_from_first_rank(unique_tensors([*module.parameters(), *module.buffers()]), group_of(group))
    extension = DDPExtension(module, group, options["bucket_size_mb"])
    record_extension(module, "ddp", extension)
    return extension
