"""``dtensor``: jit of a model PyTorch already sharded (parameters that are DTensors).

``thunder_core.jit(model)`` adds this plugin when ``model`` has DTensor parameters. It takes over
the work of the hooks PyTorch installed and traces it as collectives:

- ``fully_shard`` (FSDP2): each parameter is a DTensor sharded on dim 0 over a 1-D mesh. The
  trace takes the local shard (padded to equal rows, as this package's ``fsdp`` does) and gathers
  it with ``fsdp_all_gather_again`` where the forward uses it; autodiff reduce-scatters and
  averages its gradient back onto the shard, which reaches the DTensor's ``.grad`` through
  ``to_local()``. FSDP2's forward hooks are removed from the modules.
- ``parallelize_module`` with ``ColwiseParallel()`` / ``RowwiseParallel()`` (default layouts)
  on ``nn.Linear`` layers: each layer becomes this package's ``ColumnParallelLinear`` /
  ``RowParallelLinear`` on its local weight (``tp_copy`` in front of a column-parallel layer,
  ``tp_all_reduce`` after a row-parallel one), the computation DTensor would do. Their
  input and output hooks are removed.

The parameters stay the DTensors the user's optimizer holds, and ``state_dict()`` gives them as
they are. Other placements and styles are refused with what composes instead: ``jit`` the plain
model with ``plugins=["fsdp"]`` or ``plugins=["tensor-parallel"]``.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from thunder_core.extend import ConfigError, ModuleExtension
from thunder_plugin_distributed.collectives import GATHERS, register_group
from thunder_plugin_distributed.common import claim_module, record_extension, release_claim
from thunder_plugin_distributed.fsdp import ShardInfo
from thunder_plugin_distributed.teardown import release_at_exit
from thunder_plugin_distributed.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    make_parallel,
    split_dim,
)

_REFUGE = "jit the plain model with plugins=['fsdp'] or plugins=['tensor-parallel'] instead"


def _style_of(hook) -> tuple[str, tuple] | None:
    """(name, arguments) of what a hook ``parallelize_module`` or ``distribute_module`` installed
    calls: a ``ParallelStyle`` function with its layouts (``ColwiseParallel._prepare_input_fn``,
    ...) or a ``ParallelStyle`` object (``PrepareModuleInput``); None for any other hook."""
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, functools.partial):
            if getattr(value.func, "__module__", "").startswith("torch.distributed.tensor"):
                return value.func.__qualname__, value.args
        elif type(value).__module__.startswith("torch.distributed.tensor.parallel"):
            return type(value).__qualname__, ()
    return None


def _default_layouts() -> dict[str, tuple]:
    from torch.distributed.tensor import Replicate, Shard

    return {
        "ColwiseParallel._prepare_input_fn": ((Replicate(),), (Replicate(),)),
        "ColwiseParallel._prepare_output_fn": ((Shard(-1),), True),
        "RowwiseParallel._prepare_input_fn": ((Shard(-1),), (Shard(-1),)),
        "RowwiseParallel._prepare_output_fn": ((Replicate(),), True),
    }


def _parallel_styles(module: nn.Module) -> tuple[dict[str, type], list]:
    """Which ``nn.Linear`` layers ``parallelize_module`` split, as {module name:
    ColumnParallelLinear | RowParallelLinear}, and its hooks to remove; refuses any other style."""
    defaults = _default_layouts()
    kinds: dict[str, type] = {}
    hooks = []
    for name, child in module.named_modules():
        styles = []
        for table in (child._forward_pre_hooks, child._forward_hooks):
            for key, hook in table.items():
                style = _style_of(hook)
                if style is None:
                    continue
                qualname, args = style
                if qualname not in defaults or tuple(args) != defaults[qualname]:
                    raise ConfigError(
                        f"dtensor: {name or type(module).__name__} was parallelized with {qualname.split('.')[0]}"
                        f"{f' {args}' if args else ''}; jit of a parallelize_module model takes ColwiseParallel() and "
                        f"RowwiseParallel() with their default layouts on nn.Linear layers. Otherwise {_REFUGE}."
                    )
                styles.append(qualname.split(".")[0])
                hooks.append((child, table, key))
        if styles:
            if type(child) is not nn.Linear:
                raise ConfigError(
                    f"dtensor: {name} ({type(child).__qualname__}) was parallelized with {styles[0]}; jit of a "
                    f"parallelize_module model takes nn.Linear layers only. Otherwise {_REFUGE}."
                )
            kinds[name] = ColumnParallelLinear if styles[0] == "ColwiseParallel" else RowParallelLinear
    return kinds, hooks


def _fully_shard_states(module: nn.Module) -> list:
    """FSDP2's states of ``module`` and its submodules (checked: the default mixed precision)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    except ImportError:  # a torch without FSDP2
        return []
    states = []
    for name, child in module.named_modules():
        state = _get_module_fsdp_state(child)
        if state is None:
            continue
        policy = state._mp_policy
        if policy.param_dtype is not None or policy.reduce_dtype is not None:
            raise ConfigError(
                f"dtensor: {name or type(module).__name__} was sharded by fully_shard with a MixedPrecisionPolicy "
                f"({policy}); jit of a fully_shard model takes the default policy. Use "
                "plugins=['autocast'] for mixed precision, or " + _REFUGE
            )
        states.append(state)
    return states


def _managed(states: list) -> set[int]:
    """The ids of the parameters ``fully_shard`` manages."""
    managed: set[int] = set()
    for state in states:
        for group in getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]:
            if group is not None:
                managed.update(id(p.sharded_param) for p in group.fsdp_params)
    return managed


def _remove_hooks(states: list, hooks: list) -> None:
    for state in states:
        for handle in {
            id(h): h for h in (state._pre_forward_hook_handle, state._post_forward_hook_handle)
        }.values():
            if handle is not None:
                handle.remove()
    for child, table, key in hooks:
        table.pop(key, None)
        child._forward_hooks_with_kwargs.pop(key, None)
        child._forward_pre_hooks_with_kwargs.pop(key, None)
        child._forward_hooks_always_called.pop(key, None)


class DTensorExtension(ModuleExtension):
    """What the ``dtensor`` plugin made of a module with DTensor parameters."""

    name = "dtensor"

    def __init__(self, sharded: dict[str, tuple[ShardInfo, int]], local: frozenset, layers: int, shards: int):
        self.sharded = sharded  # parameter name -> (ShardInfo, group key) of fully_shard's parameters
        self.local = local  # names of every DTensor parameter or buffer: the trace takes its local tensor
        self._layers, self._shards = layers, shards

    def inputs(self, names: list[str], tensors: list) -> list:
        out = list(tensors)
        for i, name in enumerate(names):
            if name in self.local:
                local = tensors[i].to_local()
                found = self.sharded.get(name)
                if found is not None and local.shape[0] < found[0].shard_rows:  # padded to equal rows
                    padding = local.new_zeros((found[0].shard_rows - local.shape[0], *local.shape[1:]))
                    local = torch.cat([local, padding])
                out[i] = local
        return out

    def bind(self, names: list[str], proxies: list) -> list:
        gather = GATHERS["fsdp_all_gather_again"]  # fully_shard reshards after forward: gather again
        done: dict[int, object] = {}
        out = []
        for name, proxy in zip(names, proxies):
            found = self.sharded.get(name)
            if found is not None:
                proxy = done.setdefault(id(proxy), gather(proxy, found[0].rows, found[1]))
            out.append(proxy)
        return out

    def describe(self) -> dict[str, str]:
        return {
            "dtensor": f"{self._shards} parameters sharded by fully_shard, {self._layers} layers by parallelize_module"
        }


def dtensor_transform(module: nn.Module, options: dict) -> DTensorExtension:
    """Take over the hooks of ``fully_shard`` and ``parallelize_module``; see the module docstring.
    Everything is checked before the module changes: a refused module is left as it was."""
    claim_module(module, "dtensor")
    try:
        kinds, hooks = _parallel_styles(module)
        states = _fully_shard_states(module)
        sharded, local = _placements(module, kinds, _managed(states))
    except BaseException:
        release_claim(module, "dtensor")
        raise
    release_at_exit()
    _remove_hooks(states, hooks)
    modules = dict(module.named_modules())
    for name, kind in kinds.items():
        weight = modules[name].weight
        group = register_group(weight.device_mesh.get_group())
        make_parallel(modules[name], kind, group, tuple(weight.shape), tuple(weight.to_local().shape))
    extension = DTensorExtension(sharded, frozenset(local), len(kinds), len(sharded))
    record_extension(module, "dtensor", extension)
    return extension


def _placements(module: nn.Module, kinds: dict[str, type], managed: set[int]) -> tuple[dict, set]:
    """Every DTensor's placement checked: ({name: (ShardInfo, group key)} of fully_shard's
    parameters, the names of every DTensor parameter or buffer)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    sharded: dict[str, tuple[ShardInfo, int]] = {}
    local = set()
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for attr, tensor in getattr(owner, kind).items():
                if not isinstance(tensor, DTensor):
                    continue
                name = f"{prefix}.{attr}" if prefix else attr
                mesh, placements = tensor.device_mesh, tuple(tensor.placements)
                if mesh.ndim != 1:
                    raise ConfigError(
                        f"dtensor: {name} is placed on a {mesh.ndim}-D mesh {placements}; jit of a sharded model "
                        "takes 1-D meshes. For tensor parallelism and FSDP together, jit the plain model with "
                        "plugins=['tensor-parallel', 'fsdp'] and the tensor-parallel option size."
                    )
                local.add(name)
                if id(tensor) in managed:
                    if placements != (Shard(0),):
                        raise ConfigError(
                            f"dtensor: fully_shard placed {name} as {placements}; jit of a fully_shard model takes "
                            f"the default Shard(0). Otherwise {_REFUGE}."
                        )
                    size = mesh.size()
                    info = ShardInfo(
                        tuple(tensor.shape), math.ceil(tensor.shape[0] / size), mesh.get_local_rank()
                    )
                    sharded[name] = (info, register_group(mesh.get_group()))
                elif prefix in kinds and kind == "_parameters":
                    dim = split_dim(kinds[prefix], attr)
                    expected = Replicate() if dim is None else Shard(dim)
                    if placements != (expected,):
                        raise ConfigError(
                            f"dtensor: {name} is placed as {placements}, not as {kinds[prefix].__name__} places it "
                            f"({expected}); {_REFUGE}"
                        )
                elif placements != (Replicate(),):
                    raise ConfigError(
                        f"dtensor: {name} is a DTensor placed as {placements} by neither fully_shard nor "
                        f"ColwiseParallel/RowwiseParallel; only replicated DTensors are taken as they are. {_REFUGE}."
                    )
    return sharded, local
