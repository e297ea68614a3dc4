"""``fsdp``: parameters sharded on dim 0, gathered where the trace uses them.

At wrap time each parameter with at least one dimension is made to hold this rank's shard (the
same Parameter object, so an optimizer made before or after jit steps it): the first rank's
values, padded on dim 0 to a multiple of the group size and cut in equal pieces (rank ``r``
holds rows ``r*c .. r*c+c-1``, like ``torch.chunk``). While the forward is captured each shard
passes through ``fsdp_all_gather``, so the trace computes with the full parameter and autodiff
reduce-scatters its gradient back onto the shard. ZeRO-3 (default) gathers again in the
backward; ZeRO-2 keeps the gathered parameter from the forward until the backward. 0-dim
parameters stay replicated, their gradients averaged like ``ddp``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from thunder_core.extend import ConfigError, ModuleExtension, TensorProxy
from thunder_plugin_distributed.collectives import (
    GATHERS,
    ddp_synchronize,
    group_of,
    rank,
    world_size,
)
from thunder_plugin_distributed.common import (
    broadcast_from_first_rank,
    claim_module,
    data_parallel_group,
    record_extension,
    unique_tensors,
)
from thunder_plugin_distributed.teardown import release_at_exit


@dataclass(frozen=True)
class ShardInfo:
    """Where a sharded parameter came from: its full shape and this rank's real rows."""

    full_shape: tuple[int, ...]
    shard_rows: int  # rows per rank, padding included
    rank: int

    @property
    def rows(self) -> int:
        return self.full_shape[0]

    @property
    def valid_rows(self) -> int:
        """Rows of this rank's shard that hold real values (the rest is padding)."""
        return max(0, min(self.shard_rows, self.rows - self.rank * self.shard_rows))


def _slots(module: nn.Module):
    """(owner, attribute, full name) of every parameter slot, shared parameters included."""
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for attr, param in owner._parameters.items():
            if param is not None:
                yield owner, attr, f"{prefix}.{attr}" if prefix else attr


@torch.no_grad()
def take_shard(param: torch.Tensor, info: ShardInfo) -> torch.Tensor:
    start = info.rank * info.shard_rows
    shard = torch.zeros((info.shard_rows, *param.shape[1:]), dtype=param.dtype, device=param.device)
    if info.valid_rows:
        shard[: info.valid_rows].copy_(param[start : start + info.valid_rows])
    return shard


class FSDPExtension(ModuleExtension):
    """The ``fsdp`` plugin's view of one jitted module: which slots hold shards."""

    name = "fsdp"

    def __init__(self, module: nn.Module, group: int, zero: int, sharded: dict[str, ShardInfo]):
        self.module = module
        self.group = group
        self.gather = GATHERS["fsdp_all_gather_again" if zero == 3 else "fsdp_all_gather"]
        self.sharded = sharded  # full name of a parameter slot -> ShardInfo

    def bind(self, names: list[str], proxies: list) -> list:
        done: dict[int, object] = {}
        out = []
        for name, proxy in zip(names, proxies):
            if id(proxy) in done:
                out.append(done[id(proxy)])
                continue
            info = self.sharded.get(name)
            if info is not None:
                seen = self.gather(proxy, info.rows, self.group)
            elif isinstance(proxy, TensorProxy) and proxy.requires_grad:
                seen = ddp_synchronize(proxy, self.group)  # a replicated 0-dim parameter
            else:
                seen = proxy
            done[id(proxy)] = seen
            out.append(seen)
        return out

    # -- state dicts ----------------------------------------------------------------------------

    def _mesh(self):
        from torch.distributed.device_mesh import DeviceMesh

        device = next(iter(self.module.parameters())).device.type
        return DeviceMesh.from_group(group_of(self.group) or dist.group.WORLD, device)

    def as_dtensor(self, shard: torch.Tensor, info: ShardInfo):
        """This rank's real rows of ``shard`` as its part of a DTensor of the full shape."""
        from torch.distributed.tensor import DTensor, Shard

        full = torch.Size(info.full_shape)
        return DTensor.from_local(
            shard[: info.valid_rows],
            self._mesh(),
            [Shard(0)],
            run_check=False,
            shape=full,
            stride=torch.empty(full, device="meta").stride(),
        )

    def placed(self, name: str, local: torch.Tensor):
        """``local`` (this rank's shard of parameter ``name``, or optimizer state of its shape) as a
        DTensor of the full shape; other tensors as they are."""
        info = self.sharded.get(name)
        if info is None or tuple(local.shape) != (info.shard_rows, *info.full_shape[1:]):
            return local
        return self.as_dtensor(local, info)

    @torch.no_grad()
    def local_of(self, name: str, value: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        """This rank's padded shard of ``value`` (a DTensor from ``placed``, or the full tensor)."""
        from torch.distributed.tensor import DTensor

        info = self.sharded.get(name)
        if info is None:
            return value
        if isinstance(value, DTensor):
            from torch.distributed.tensor import Shard

            mesh = value.device_mesh
            if (
                tuple(value.placements) == (Shard(0),)
                and mesh.ndim == 1
                and mesh.size() == world_size(self.group)
                and mesh.get_local_rank() == rank(self.group)
            ):
                local = value.to_local()  # laid out as this plugin lays it out (from placed())
                if local.data_ptr() == held.data_ptr():
                    return held
                padded = torch.zeros_like(held)
                padded[: local.shape[0]].copy_(local)
                return padded
            value = value.full_tensor()  # another layout
        if tuple(value.shape) == info.full_shape:
            return take_shard(value.to(held.device), info)
        raise ConfigError(
            f"fsdp: {name!r} has shape {tuple(value.shape)}; expected the full shape {info.full_shape} "
            "or a DTensor from this module's state_dict()"
        )

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every sharded parameter gathered to its full tensor (on every rank)."""
        state = self.module.state_dict()
        for key, value in state.items():
            info = self.sharded.get(key)
            if info is not None:
                state[key] = self.full_parameter(value, info)
        return state

    def state_dict(self, module, *args, **kwargs) -> dict:
        """Sharded parameters as DTensors (for ``torch.distributed.checkpoint``), the rest as they are."""
        state = module.state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        for key, value in state.items():
            info = self.sharded.get(key[len(prefix) :])
            if info is not None:
                state[key] = self.as_dtensor(value.detach(), info)
        return state

    @torch.no_grad()
    def load_state_dict(self, module, state_dict, strict: bool = True):
        """Accepts what ``state_dict`` gives (DTensors) or full tensors (each rank takes its rows)."""
        params = {name: owner._parameters[attr] for owner, attr, name in _slots(module)}
        converted = dict(state_dict)
        for key, value in state_dict.items():
            if key in self.sharded:
                shard = params[key]
                local = self.local_of(key, value, shard)
                if local.data_ptr() != shard.data_ptr():
                    shard.copy_(local)
                converted[key] = shard
        return module.load_state_dict(converted, strict=strict)

    @torch.no_grad()
    def full_parameter(self, shard: torch.Tensor, info: ShardInfo) -> torch.Tensor:
        size = world_size(self.group)
        gathered = torch.empty(
            (info.shard_rows * size, *shard.shape[1:]), dtype=shard.dtype, device=shard.device
        )
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(gathered, shard.contiguous(), group=group_of(self.group))
        return gathered[: info.rows].clone()


def fsdp_transform(module: nn.Module, options: dict) -> FSDPExtension:
    """Shard the module's parameters in place; see the module docstring."""
    zero = options["zero"]
    if zero not in (2, 3):
        raise ConfigError(f"fsdp: option zero must be 2 or 3, got {zero}")
    claim_module(module, "fsdp")
    group = data_parallel_group(module)
    release_at_exit()
    size, me = world_size(group), rank(group)
    if options["broadcast"]:
        broadcast_from_first_rank(unique_tensors([*module.parameters(), *module.buffers()]), group_of(group))
    infos: dict[int, ShardInfo] = {}
    sharded: dict[str, ShardInfo] = {}
    for owner, attr, name in list(_slots(module)):
        param = owner._parameters[attr]
        if param.dim() == 0:
            continue
        if id(param) not in infos:
            if param.grad is not None:
                raise ConfigError(
                    f"fsdp: {name} already has a gradient; jit the model before the first backward "
                    "(its gradients and optimizer state are sharded with it)"
                )
            info = ShardInfo(tuple(param.shape), math.ceil(param.shape[0] / size), me)
            # The Parameter object keeps its identity (an optimizer made before jit still steps
            # it) and now holds the shard.
            param.data = take_shard(param.detach(), info)
            infos[id(param)] = info
        sharded[name] = infos[id(param)]
    extension = FSDPExtension(module, group, zero, sharded)
    record_extension(module, "fsdp", extension)
    return extension


def full_state_dict(jitted_module) -> dict[str, torch.Tensor]:
    """The state dict with every sharded or split parameter gathered to its full tensor (on every rank)."""
    for extension in getattr(jitted_module, "extensions", ()):
        if hasattr(extension, "full_state_dict"):  # tensor-parallel (with fsdp stacked) or fsdp
            return extension.full_state_dict()
    return {  # DTensors of a model PyTorch sharded (the dtensor plugin), or plain tensors
        name: value.full_tensor() if hasattr(value, "full_tensor") else value
        for name, value in jitted_module.state_dict().items()
    }


@torch.no_grad()
def clip_grad_norm_(jitted_module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a jitted module under ``fsdp`` (or ``ddp``, or none).

    Under ``fsdp`` each rank holds only its shards' gradients, so PyTorch's function on
    ``parameters()`` would clip by the norm of this rank's part: a different result on every rank.
    This one sums the shards' contributions across ranks (padding rows hold zero gradients), so
    every rank clips by the norm of the whole gradient. Returns that total norm.
    """
    params = [p for p in unique_tensors(jitted_module.parameters()) if p.grad is not None]
    fsdp = next((e for e in getattr(jitted_module, "extensions", ()) if isinstance(e, FSDPExtension)), None)
    if fsdp is None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    sharded = {id(p) for p in fsdp.module.parameters() if p.dim() > 0}
    norm_type = float(norm_type)
    if not params:
        return torch.tensor(0.0)
    device = params[0].grad.device
    if norm_type == float("inf"):
        local = max((p.grad.abs().max() for p in params), default=torch.tensor(0.0, device=device)).float()
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group_of(fsdp.group))
        total = local
    else:
        local = torch.zeros((), dtype=torch.float64, device=device)
        replicated = torch.zeros((), dtype=torch.float64, device=device)
        for p in params:
            part = p.grad.double().norm(norm_type) ** norm_type
            if id(p) in sharded:
                local += part
            else:
                replicated += part  # the same on every rank: counted once
        dist.all_reduce(local, group=group_of(fsdp.group))
        total = (local + replicated) ** (1.0 / norm_type)
    scale = max_norm / (float(total) + 1e-6)
    if scale < 1.0:
        for p in params:
            p.grad.mul_(scale)
    return total.float()
