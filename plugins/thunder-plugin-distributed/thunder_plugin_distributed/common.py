"""What the ddp and fsdp plugins share: the probe, the process group, the one-plugin-per-module rule."""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn

from thunder_core.extend import Availability, ConfigError

_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> "ddp" | "fsdp"


def probe() -> Availability:
    """Available when torch.distributed is built in and a default process group is initialized."""
    if not dist.is_available():
        return Availability.missing(
            "this torch build has no torch.distributed", "install a torch build with distributed support"
        )
    if not dist.is_initialized():
        return Availability.missing(
            "no torch.distributed process group is initialized",
            "launch with torchrun and call torch.distributed.init_process_group() before thunder_core.jit",
        )
    return Availability.ok()


def claim_module(module: nn.Module, plugin: str) -> None:
    """Refuse to prepare a module twice (ddp and fsdp together, or jit of a jitted module's model)."""
    earlier = _PREPARED.get(module)
    if earlier is not None:
        raise ConfigError(
            f"{plugin}: this module was already prepared by the {earlier!r} plugin (its parameters are "
            f"{'sharded' if earlier == 'fsdp' else 'synchronized'}); select one of ddp and fsdp per model, "
            "and jit the original model once"
        )
    _PREPARED[module] = plugin


@torch.no_grad()
def broadcast_from_first_rank(tensors, group) -> None:
    """Every rank gets the first rank's values of ``tensors`` (parameters, buffers)."""
    source = dist.get_global_rank(group, 0) if group is not None else 0
    for tensor in tensors:
        dist.broadcast(tensor.data, src=source, group=group)


def unique_tensors(tensors) -> list[torch.Tensor]:
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out
