"""Optimizer state in a form ``torch.distributed.checkpoint`` saves and loads across ranks.

An optimizer on an ``fsdp`` or ``tensor-parallel`` module holds per-parameter state of the
shape each rank holds (AdamW's ``exp_avg``, ``exp_avg_sq``). ``optimizer_state_dict`` keys that
state by parameter name and gives it as DTensors of the full shape, placed as
``jitted.state_dict()`` places the parameters, so ``torch.distributed.checkpoint.save`` writes
every rank's part once and ``load`` puts it back, also into a job with another layout (another
plugin, another number of ranks, one process). With ``ddp`` (or no plugin) every rank holds the
whole state and the tensors stay plain.
"""

from __future__ import annotations

import torch

from thunder_plugin_distributed.fsdp import _slots


def _placer(jitted_module):
    """The extension that places per-parameter state: tensor-parallel (with what is stacked on
    it) or fsdp; None when every rank holds everything."""
    for extension in getattr(jitted_module, "extensions", ()):
        if hasattr(extension, "placed"):
            return extension
    return None


def _names_by_parameter(module) -> dict[int, str]:
    names: dict[int, str] = {}
    for owner, attr, name in _slots(module):
        names.setdefault(id(owner._parameters[attr]), name)
    return names


@torch.no_grad()
def _initialize_state(optimizer) -> None:
    """Create the optimizer's lazily made state (a step with zero gradients and learning rate 0),
    so a fresh job has tensors for ``torch.distributed.checkpoint.load`` to fill."""
    if optimizer.state:
        return
    saved_lrs = []
    for group in optimizer.param_groups:
        saved_lrs.append(group["lr"])
        group["lr"] = 0.0 if not isinstance(group["lr"], torch.Tensor) else torch.zeros_like(group["lr"])
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, saved_lrs):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def optimizer_state_dict(jitted_module, optimizer) -> dict:
    """``{"state": {name: {...}}, "param_groups": [...]}`` with parameter names for indices and,
    under ``fsdp`` or ``tensor-parallel``, per-parameter state as DTensors; made if the optimizer
    has not stepped yet."""
    _initialize_state(optimizer)
    module = getattr(jitted_module, "_model", jitted_module)
    names = _names_by_parameter(module)
    placer = _placer(jitted_module)
    raw = optimizer.state_dict()
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in raw["state"].items():
        name = names[id(flat[index])]
        state[name] = {
            key: placer.placed(name, value)
            if placer is not None and isinstance(value, torch.Tensor) and value.shape == flat[index].shape
            else value
            for key, value in values.items()
        }
    groups = []
    for group in raw["param_groups"]:
        groups.append({**group, "params": [names[id(flat[i])] for i in group["params"]]})
    return {"state": state, "param_groups": groups}


def load_optimizer_state_dict(jitted_module, optimizer, state_dict: dict) -> None:
    """Load what ``optimizer_state_dict`` gave (after ``torch.distributed.checkpoint.load``)."""
    from torch.distributed.tensor import DTensor

    module = getattr(jitted_module, "_model", jitted_module)
    names = _names_by_parameter(module)
    placer = _placer(jitted_module)
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    index_of = {names[id(p)]: i for i, p in enumerate(flat)}
    state = {}
    for name, values in state_dict["state"].items():
        param = flat[index_of[name]]
        converted = {}
        for key, value in values.items():
            if placer is not None and isinstance(value, torch.Tensor) and value.dim() and param.dim():
                value = placer.local_of(name, value, param)
            elif isinstance(value, DTensor):
                value = value.full_tensor()
            converted[key] = value
        state[index_of[name]] = converted
    groups = [
        {**group, "params": [index_of[n] for n in group["params"]]} for group in state_dict["param_groups"]
    ]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
