"""What the distributed plugins share: the probe, the process groups, which plugins prepared a module."""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn

from thunder_core.extend import Availability, ConfigError
from thunder_plugin_distributed.collectives import register_group


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


#: module -> {plugin name: its extension (None while the transform runs)}, in the order applied
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: module -> the group key over which ddp or fsdp work: the data dimension of a tensor-parallel mesh
_DATA_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STACKABLE = {"tensor-parallel": ("ddp", "fsdp")}  # may be followed on the same module by


def claim_module(module: nn.Module, plugin: str) -> None:
    """Refuse to prepare a module twice (ddp and fsdp together, or jit of a jitted module's model).
    ``tensor-parallel`` followed by ``fsdp`` or ``ddp`` is the one stack allowed (a 2-D mesh)."""
    earlier = list(_PREPARED.get(module, {}))
    if earlier:
        if len(earlier) == 1 and plugin in _STACKABLE.get(earlier[0], ()):
            _PREPARED[module][plugin] = None
            return
        if plugin == "tensor-parallel" and earlier in (["ddp"], ["fsdp"]):
            raise ConfigError(
                f"tensor-parallel: this module was already prepared by {earlier[0]!r}; list 'tensor-parallel' "
                f"before {earlier[0]!r} in plugins (the layers are split first, then each part is "
                f"{'sharded' if earlier[0] == 'fsdp' else 'synchronized'} over the data dimension)"
            )
        raise ConfigError(
            f"{plugin}: this module was already prepared by the {earlier[-1]!r} plugin; select one of ddp "
            "and fsdp per model (each may follow tensor-parallel), and jit the original model once"
        )
    _PREPARED[module] = {plugin: None}


def release_claim(module: nn.Module, plugin: str) -> None:
    """Undo ``claim_module`` (the transform refused the module before changing it)."""
    claimed = _PREPARED.get(module, {})
    claimed.pop(plugin, None)
    if not claimed:
        _PREPARED.pop(module, None)
        _DATA_GROUPS.pop(module, None)


def record_extension(module: nn.Module, plugin: str, extension) -> None:
    """Keep what ``plugin``'s transform made of ``module``, for the plugins stacked with it."""
    _PREPARED[module][plugin] = extension


def prepared_by(module: nn.Module) -> dict:
    """{plugin name: extension} of the distributed plugins that prepared ``module``."""
    return dict(_PREPARED.get(module, {}))


def set_data_parallel_group(module: nn.Module, group: int) -> None:
    _DATA_GROUPS[module] = group


def data_parallel_group(module: nn.Module) -> int:
    """The group key over which ddp and fsdp work on ``module``: every rank, or the data dimension
    of the mesh a ``tensor-parallel`` plugin with ``size`` below the world size made."""
    found = _DATA_GROUPS.get(module)
    if found is not None:
        return found
    if "tensor-parallel" in _PREPARED.get(module, {}):
        raise ConfigError(
            "tensor-parallel splits the layers over a group with no data dimension beside it, so there is "
            "nothing for ddp or fsdp to work over; give tensor-parallel the option size (ranks per "
            "tensor-parallel group, a divisor of the world size) or a 2-D mesh named ('data', 'tensor')"
        )
    return register_group(None)


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
