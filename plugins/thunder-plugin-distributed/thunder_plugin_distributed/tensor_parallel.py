"""``tensor-parallel``: linear layers split across the ranks of a group, as in Megatron-LM.

At wrap time each chosen ``nn.Linear`` keeps only this rank's part of its weight (the same
Parameter object, now holding the part) and becomes a

- ``ColumnParallelLinear``: output features split (weight and bias rows ``r*o/W .. (r+1)*o/W``);
  its input enters through ``tp_copy`` (whose gradient is summed over the group) and its output
  stays split, so what follows (an activation, the split into heads) runs on this rank's part;
- ``RowParallelLinear``: input features split (weight columns); it takes the split activation,
  its partial results are summed by ``tp_all_reduce``, and the bias (whole on every rank) is
  added after the sum.

A column-parallel layer followed by a row-parallel one (attention's projections, an MLP) then
needs one all-reduce in the forward and one in the backward. Every rank trains on the same batch
and holds the same values of everything not split (embeddings, norms, the head), whose gradients
are therefore the same on every rank.

Which layers: the options ``column`` and ``row`` (comma-separated ``fnmatch`` patterns over module
names); without them, the attention and MLP projections of litgpt's ``GPT`` and of Hugging Face
Llama-style models (``q_proj``/``k_proj``/``v_proj``/``o_proj``, ``gate_proj``/``up_proj``/
``down_proj``). litgpt's fused ``qkv`` is split by heads (each rank takes its query heads and its
key/value groups), and its attention is given a config with this rank's head counts.
"""

from __future__ import annotations

import dataclasses
import fnmatch

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from thunder_core.extend import ConfigError, ModuleExtension
from thunder_plugin_distributed.collectives import group_of, rank, register_group, world_size
from thunder_plugin_distributed.common import (
    broadcast_from_first_rank,
    claim_module,
    prepared_by,
    record_extension,
    release_claim,
    set_data_parallel_group,
    unique_tensors,
)
from thunder_plugin_distributed.fsdp import take_shard
from thunder_plugin_distributed.teardown import release_at_exit
from thunder_plugin_distributed.tp_collectives import (
    tp_all_gather_sequence,
    tp_all_reduce,
    tp_copy,
    tp_gather_sequence,
    tp_reduce_scatter_sequence,
    tp_split_sequence,
)

LITGPT = {
    "column": ["*.attn.qkv", "*.mlp.fc_1", "*.mlp.fc_2", "*.mlp.fc"],
    "row": ["*.attn.proj", "*.mlp.proj"],
}
LLAMA = {
    "column": [
        "*.self_attn.q_proj",
        "*.self_attn.k_proj",
        "*.self_attn.v_proj",
        "*.mlp.gate_proj",
        "*.mlp.up_proj",
    ],
    "row": ["*.self_attn.o_proj", "*.mlp.down_proj"],
}


class ColumnParallelLinear(nn.Linear):
    """An ``nn.Linear`` holding this rank's output features; its output stays split. Its input
    enters through ``tp_copy``, applied by the layer, or once by the module around it for all of
    its column-parallel layers (the default plans; with sequence parallelism always, as the
    gather along the sequence)."""

    tp_group: int
    tp_full_shape: tuple[int, int]
    tp_sequence: bool

    tp_entered_by_owner: bool = False  # the module around it applied tp_copy (or the gather) to its input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tp_entered_by_owner:
            x = tp_copy(x, self.tp_group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Linear):
    """An ``nn.Linear`` holding this rank's input features; its partial results are summed
    (with sequence parallelism: summed and scattered along the sequence)."""

    tp_group: int
    tp_full_shape: tuple[int, int]
    tp_sequence: bool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leave = tp_reduce_scatter_sequence if self.tp_sequence else tp_all_reduce
        y = leave(F.linear(x, self.weight), self.tp_group)
        return y if self.bias is None else y + self.bias


def _patterns(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _default_plan(module: nn.Module) -> dict[str, list[str]]:
    if type(module).__module__.startswith("litgpt."):
        return LITGPT
    names = {name.rsplit(".", 1)[-1] for name, _ in module.named_modules()}
    if {"q_proj", "k_proj", "v_proj", "o_proj"} <= names:
        return LLAMA
    raise ConfigError(
        f"tensor-parallel: no default plan for {type(module).__qualname__}; name the layers to split with "
        "options column=... and row=... (comma-separated fnmatch patterns over module names, e.g. "
        "column='*.mlp.up', row='*.mlp.down')"
    )


def _is_litgpt_qkv(parent: nn.Module, attr: str) -> bool:
    return attr == "qkv" and type(parent).__module__.startswith("litgpt.") and hasattr(parent, "config")


def _divisible(what: str, count: int, size: int) -> None:
    if count % size:
        raise ConfigError(
            f"tensor-parallel: {what} ({count}) does not divide by the {size} ranks of the group"
        )


@torch.no_grad()
def _take(param: nn.Parameter, part: torch.Tensor) -> None:
    """The Parameter object keeps its identity (an optimizer made before still steps it)."""
    param.data = part.contiguous().clone()


class TensorParallelExtension(ModuleExtension):
    """The ``tensor-parallel`` plugin's view of one jitted module: which layers are split, over
    which group, and (on a 2-D mesh) which ``fsdp`` or ``ddp`` works over the data dimension."""

    name = "tensor-parallel"

    def __init__(
        self,
        module: nn.Module,
        group: int,
        layers: dict[str, nn.Linear],
        qkv: dict,
        summed: frozenset = frozenset(),
        mesh=None,
    ):
        self.module = module
        self.group = group
        self.layers = layers  # module name -> ColumnParallelLinear | RowParallelLinear
        self.qkv = qkv  # module name of a litgpt qkv -> (n_head, n_query_groups, head_size) in full
        self.summed = summed  # parameters used on sequence-split activations: gradients summed
        self.mesh = mesh  # the ("data", "tensor") DeviceMesh when the group is not every rank
        self.data_size = 1 if mesh is None else mesh["data"].size()
        self._meshes: dict[str, object] = {}
        #: full parameter name -> (layer name, "weight" | "bias") of every split parameter
        self.split = {
            f"{layer_name}.{attr}": (layer_name, attr)
            for layer_name, layer in layers.items()
            for attr in ("weight", "bias")
            if getattr(layer, attr) is not None
        }

    def bind(self, names: list[str], proxies: list) -> list:
        if self.data_size > 1 and len(prepared_by(self.module)) < 2:
            raise ConfigError(
                f"tensor-parallel: size={world_size(self.group)} of {dist.get_world_size()} ranks leaves a data "
                f"dimension of {self.data_size} ranks that would train apart; add 'fsdp' or 'ddp' "
                "after 'tensor-parallel' in plugins, or leave the option size at 0 (every rank)"
            )
        if not self.summed:
            return proxies
        done: dict[int, object] = {}
        out = []
        for name, proxy in zip(names, proxies):
            if name in self.summed and getattr(proxy, "requires_grad", False):
                proxy = done.setdefault(id(proxy), tp_copy(proxy, self.group))
            out.append(proxy)
        return out

    def describe(self) -> dict[str, str]:
        sequence = ", sequence parallel" if self.summed else ""
        size = world_size(self.group)
        return {"tensor-parallel": f"{len(self.layers)} linear layers split over {size} ranks{sequence}"}

    # -- state dicts: DTensors that torch.distributed.checkpoint saves and loads -----------------

    def _fsdp(self):
        return prepared_by(self.module).get("fsdp")

    def _device_mesh(self, kind: str):
        """The mesh of the tensor dimension (``"tensor"``), or of (tensor, data) for parameters
        that ``fsdp`` also shards: the layer split first, its part sharded on dim 0 (``"2d"``)."""
        if kind not in self._meshes:
            from torch.distributed.device_mesh import DeviceMesh

            device = next(iter(self.module.parameters())).device.type
            if kind == "2d":
                order = [self.mesh.mesh_dim_names.index("tensor"), self.mesh.mesh_dim_names.index("data")]
                self._meshes[kind] = DeviceMesh(
                    device, self.mesh.mesh.permute(order).contiguous(), mesh_dim_names=("tensor", "data")
                )
            elif self.mesh is not None:
                self._meshes[kind] = self.mesh["tensor"]
            else:
                self._meshes[kind] = DeviceMesh.from_group(group_of(self.group) or dist.group.WORLD, device)
        return self._meshes[kind]

    def _split_dim(self, name: str) -> int | None:
        """The dimension along which ``name`` is split over the group (None: whole on every rank)."""
        found = self.split.get(name)
        return None if found is None else split_dim(type(self.layers[found[0]]), found[1])

    def _layout(self, name: str):
        """(mesh, placements, this rank's fsdp ShardInfo or None) of the DTensor ``placed`` makes
        for ``name`` by placement; None for a tensor given plain or, split by heads, replicated."""
        from torch.distributed.tensor import Replicate, Shard

        fsdp = self._fsdp()
        shard = fsdp.sharded.get(name) if fsdp is not None else None
        found = self.split.get(name)
        if found is not None and found[0] in self.qkv:
            return None
        dim = self._split_dim(name)
        placement = Replicate() if dim is None else Shard(dim)
        if shard is not None:
            return self._device_mesh("2d"), (placement, Shard(0)), shard
        if dim is None:
            return None
        return self._device_mesh("tensor"), (placement,), None

    def placed(self, name: str, local: torch.Tensor):
        """``local`` (this rank's tensor of parameter ``name``, or optimizer state of its shape) as
        a DTensor of the full shape; a tensor whole and the same on every rank stays plain."""
        from torch.distributed.tensor import DTensor, Replicate

        found = self.split.get(name)
        if found is not None and found[0] in self.qkv:
            # Split by heads (q, k and v parts of every rank): no DTensor placement says that.
            fsdp = self._fsdp()
            full = self.full(name, local)
            mesh = self._device_mesh("2d" if fsdp is not None and name in fsdp.sharded else "tensor")
            return DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False)
        layout = self._layout(name)
        if layout is None:
            return local
        mesh, placements, shard = layout
        shape = list(shard.full_shape if shard is not None else local.shape)
        dim = self._split_dim(name)
        if dim is not None:
            shape[dim] *= world_size(self.group)
        if shard is not None:
            local = local[: shard.valid_rows]
        full = torch.Size(shape)
        stride = torch.empty(full, device="meta").stride()
        return DTensor.from_local(local, mesh, list(placements), run_check=False, shape=full, stride=stride)

    @torch.no_grad()
    def full(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor of parameter ``name`` from every rank's ``local`` (a collective)."""
        fsdp = self._fsdp()
        shard = fsdp.sharded.get(name) if fsdp is not None else None
        if shard is not None:
            local = fsdp.full_parameter(local, shard)
        dim = self._split_dim(name)
        if dim is None:
            return local.detach().clone()
        parts = [
            torch.empty_like(local, memory_format=torch.contiguous_format)
            for _ in range(world_size(self.group))
        ]
        dist.all_gather(parts, local.detach().contiguous(), group=group_of(self.group))
        layer_name = self.split[name][0]
        if layer_name in self.qkv:  # each rank's q heads, then k groups, then v groups
            n_head, groups, head_size = self.qkv[layer_name]
            size = world_size(self.group)
            q_rows, kv_rows = n_head // size * head_size, groups // size * head_size
            qs = [p[:q_rows] for p in parts]
            ks = [p[q_rows : q_rows + kv_rows] for p in parts]
            vs = [p[q_rows + kv_rows :] for p in parts]
            return torch.cat([*qs, *ks, *vs], dim=0)
        return torch.cat(parts, dim=dim)

    @torch.no_grad()
    def local_of(self, name: str, value: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        """What this rank holds of ``value`` (a DTensor, or the full tensor) for parameter ``name``,
        whose tensor on this rank is ``held``."""
        from torch.distributed.tensor import DTensor

        layout = self._layout(name) if isinstance(value, DTensor) else None
        if layout is not None and value.device_mesh == layout[0] and tuple(value.placements) == layout[1]:
            local = value.to_local()  # laid out as placed() lays it out: this rank's part as it is
            shard = layout[2]
            if shard is not None and local.shape[0] < shard.shard_rows:
                padding = local.new_zeros((shard.shard_rows - local.shape[0], *local.shape[1:]))
                local = torch.cat([local, padding])
            return local.to(device=held.device)
        full = value.full_tensor() if isinstance(value, DTensor) else value
        found = self.split.get(name)
        if found is not None:
            layer_name, attr = found
            layer = self.layers[layer_name]
            expected = list(layer.tp_full_shape) if attr == "weight" else [layer.tp_full_shape[0]]
            if list(full.shape) != expected:
                raise ConfigError(
                    f"tensor-parallel: {name!r} has shape {tuple(full.shape)}; expected the full shape "
                    f"{tuple(expected)} or a DTensor from this module's state_dict()"
                )
            full = _part_of(
                full, type(layer), attr, self.qkv.get(layer_name), world_size(self.group), rank(self.group)
            )
        fsdp = self._fsdp()
        shard = fsdp.sharded.get(name) if fsdp is not None else None
        if shard is not None:
            full = take_shard(full.to(held.device), shard)
        return full.to(device=held.device)

    def _kept(self, name: str) -> bool:
        fsdp = self._fsdp()
        return name in self.split or (fsdp is not None and name in fsdp.sharded)

    def state_dict(self, module, *args, **kwargs) -> dict:
        """Split (and sharded) parameters as DTensors of their full shape; litgpt's ``qkv``, split
        by heads, as a replicated DTensor of the gathered tensor."""
        state = module.state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        for key, value in state.items():
            name = key[len(prefix) :]
            if self._kept(name):
                state[key] = self.placed(name, value.detach())
        return state

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered to its full tensor (on every rank)."""
        return {
            name: self.full(name, value) if self._kept(name) else value
            for name, value in self.module.state_dict().items()
        }

    @torch.no_grad()
    def load_state_dict(self, module, state_dict, strict: bool = True):
        """DTensors (as ``state_dict`` gives them) or full tensors: each rank takes its part."""
        held = dict(module.state_dict(keep_vars=True))
        converted = dict(state_dict)
        for key, value in state_dict.items():
            if self._kept(key) and key in held:
                converted[key] = self.local_of(key, value, held[key])
        return module.load_state_dict(converted, strict=strict)


def _part_of(full: torch.Tensor, kind: type, attr: str, qkv, size: int, me: int) -> torch.Tensor:
    """This rank's part of a full weight or bias of a ``kind`` layer."""
    if kind is RowParallelLinear:
        if attr == "bias":
            return full
        return full.chunk(size, dim=1)[me]
    if qkv is not None:
        n_head, groups, head_size = qkv
        q, kv = n_head * head_size, groups * head_size
        parts = [full[:q], full[q : q + kv], full[q + kv :]]
        return torch.cat([p.chunk(size, dim=0)[me] for p in parts], dim=0)
    return full.chunk(size, dim=0)[me]


def _check_split(name: str, layer: nn.Linear, kind: type, size: int) -> None:
    full_shape = tuple(layer.weight.shape)
    dim = 1 if kind is RowParallelLinear else 0
    _divisible(f"{'input' if dim else 'output'} features of {name} {full_shape}", full_shape[dim], size)
    if any(p is not None and p.grad is not None for p in (layer.weight, layer.bias)):
        raise ConfigError(f"tensor-parallel: {name} has a gradient; jit the model before the first backward")


def _split(layer: nn.Linear, kind: type, group: int, qkv, size: int, me: int, sequence: bool) -> None:
    full_shape = tuple(layer.weight.shape)
    for attr in ("weight", "bias"):
        param = getattr(layer, attr)
        if param is not None:
            _take(param, _part_of(param.detach(), kind, attr, qkv, size, me))
    make_parallel(layer, kind, group, full_shape, local_shape=tuple(layer.weight.shape), sequence=sequence)


def make_parallel(
    layer: nn.Linear, kind: type, group: int, full_shape: tuple, local_shape: tuple, sequence: bool = False
) -> None:
    """Turn ``layer`` (holding this rank's part, of ``local_shape``) into a ``kind`` layer."""
    layer.__class__ = kind
    layer.tp_group = group
    layer.tp_sequence = sequence
    layer.tp_full_shape = full_shape
    layer.out_features, layer.in_features = local_shape


def split_dim(kind: type, attr: str) -> int | None:
    """The dimension of a ``kind`` layer's ``attr`` ("weight" or "bias") split over the group."""
    if kind is RowParallelLinear:
        return None if attr == "bias" else 1
    return 0


def _check_litgpt_heads(attention: nn.Module, size: int) -> None:
    config = attention.config
    if getattr(config, "norm_qk", False) and getattr(config, "norm_qk_type", "") == "olmo2":
        raise ConfigError(
            "tensor-parallel: olmo2-style query/key norms span every head; they cannot be split"
        )
    _divisible("the number of attention heads", config.n_head, size)
    _divisible("the number of query groups", config.n_query_groups, size)


def _local_litgpt_config(attention: nn.Module, size: int, configs: dict):
    """litgpt attention reads its head counts from its config: one config with this rank's."""
    config = attention.config
    if id(config) not in configs:
        configs[id(config)] = dataclasses.replace(
            config,
            n_head=config.n_head // size,
            n_query_groups=config.n_query_groups // size,
            head_size=config.head_size,
        )
    attention.config = configs[id(config)]
    return config.n_head, config.n_query_groups, config.head_size


def _check_llama_heads(module: nn.Module, size: int) -> None:
    config = getattr(module, "config", None)
    for field in ("num_attention_heads", "num_key_value_heads"):
        count = getattr(config, field, None)
        if isinstance(count, int):
            _divisible(f"config.{field}", count, size)


def tensor_parallel_transform(module: nn.Module, options: dict) -> TensorParallelExtension:
    """Split the chosen linear layers of ``module`` in place; see the module docstring. Everything
    is checked before the module changes: a refused module is left as it was."""
    claim_module(module, "tensor-parallel")
    try:
        group, mesh = _tensor_group(module, options["size"], options["mesh"])
        plan, default = _plan(module, options, world_size(group))
    except BaseException:
        release_claim(module, "tensor-parallel")
        raise
    release_at_exit()
    size, me = world_size(group), rank(group)
    if options["broadcast"]:
        # Within the tensor-parallel group; fsdp or ddp then broadcast the parts over the data one.
        broadcast_from_first_rank(unique_tensors([*module.parameters(), *module.buffers()]), group_of(group))
    layers: dict[str, nn.Linear] = {}
    qkv: dict[str, tuple] = {}
    configs: dict[int, object] = {}
    for name, child, kind, parent in plan:
        heads = None
        if parent is not None:  # litgpt's fused qkv, split by heads
            heads = qkv[name] = _local_litgpt_config(parent, size, configs)
        _split(child, kind, group, heads, size, me, options["sequence_parallel"])
        layers[name] = child
    if options["sequence_parallel"]:
        summed = _sequence_parallel(module, layers, group)
    else:
        summed = frozenset()
        if default:  # attention and MLP modules read their input only through these layers
            _enter_at_owners(module, layers, tp_copy, group)
    extension = TensorParallelExtension(module, group, layers, qkv, summed, mesh)
    record_extension(module, "tensor-parallel", extension)
    return extension


def _plan(module: nn.Module, options: dict, size: int) -> tuple[list, bool]:
    """[(name, layer, kind, its litgpt attention if a fused qkv else None)] of the layers to split,
    every one checked; and whether the default plan of the model's family was used."""
    column, row = _patterns(options["column"]), _patterns(options["row"])
    default = not column and not row
    if default:
        family = _default_plan(module)
        column, row = family["column"], family["row"]
        if family is LLAMA:
            _check_llama_heads(module, size)
    parents = dict(module.named_modules())
    plan = []
    for name, child in module.named_modules():
        kind = (
            ColumnParallelLinear
            if any(fnmatch.fnmatchcase(name, p) for p in column)
            else RowParallelLinear
            if any(fnmatch.fnmatchcase(name, p) for p in row)
            else None
        )
        if kind is None:
            continue
        if type(child) is not nn.Linear:
            raise ConfigError(
                f"tensor-parallel: {name} ({type(child).__qualname__}) matches a pattern but only nn.Linear "
                "layers can be split"
            )
        _check_split(name, child, kind, size)
        parent_name, _, attr = name.rpartition(".")
        attention = None
        if kind is ColumnParallelLinear and _is_litgpt_qkv(parents[parent_name], attr):
            attention = parents[parent_name]
            _check_litgpt_heads(attention, size)
        plan.append((name, child, kind, attention))
    if not plan:
        raise ConfigError(f"tensor-parallel: no nn.Linear matches column={column} or row={row}")
    if options["sequence_parallel"]:
        _blocks(module, [name for name, *_ in plan])
        if "lm_head" not in parents:
            raise ConfigError(
                "tensor-parallel: sequence_parallel needs the model's output head, named lm_head"
            )
    return plan, default


def _tensor_group(module: nn.Module, size: int, given=None):
    """The group key of the tensor dimension and, on a 2-D mesh, the mesh (dimensions named
    ``"data"`` and ``"tensor"``). ``given``: the user's 1-D or 2-D DeviceMesh or process group;
    else ``size`` consecutive ranks form a tensor-parallel group (as ``init_device_mesh`` lays
    them out), every rank with ``size`` 0."""
    if given is not None:
        return _given_group(module, given)
    world = dist.get_world_size()
    if size in (0, world):
        return register_group(None), None
    if size < 0 or world % size:
        raise ConfigError(
            f"tensor-parallel: option size={size} does not divide the {world} ranks; give a divisor of {world} "
            "(0: every rank)"
        )
    from torch.distributed.device_mesh import init_device_mesh

    device = next(iter(module.parameters())).device.type
    mesh = init_device_mesh(device, (world // size, size), mesh_dim_names=("data", "tensor"))
    set_data_parallel_group(module, register_group(mesh["data"].get_group()))
    return register_group(mesh["tensor"].get_group()), mesh


def _given_group(module: nn.Module, given):
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(given, dist.ProcessGroup):
        return register_group(given), None
    if isinstance(given, DeviceMesh) and given.ndim == 1:
        return register_group(given.get_group()), None
    if (
        isinstance(given, DeviceMesh)
        and given.ndim == 2
        and set(given.mesh_dim_names or ()) == {"data", "tensor"}
    ):
        set_data_parallel_group(module, register_group(given["data"].get_group()))
        return register_group(given["tensor"].get_group()), given
    raise ConfigError(
        f"tensor-parallel: option mesh is {given!r}; give a torch.distributed ProcessGroup, a 1-D DeviceMesh "
        "(the ranks that split the layers), or a 2-D DeviceMesh with mesh_dim_names ('data', 'tensor')"
    )


def _blocks(module: nn.Module, layers) -> tuple[str, nn.ModuleList]:
    """The list of repeated layers that holds the split projections (``layers``: their names)."""
    first = next(iter(layers))
    lists = [
        (name, child)
        for name, child in module.named_modules()
        if isinstance(child, nn.ModuleList) and len(child) and first.startswith(name + ".")
    ]
    if not lists:
        raise ConfigError(
            f"tensor-parallel: sequence_parallel needs the split layers inside an nn.ModuleList of blocks; "
            f"{first} is not"
        )
    return max(lists, key=lambda item: len(item[0]))


def _sequence_parallel(module: nn.Module, layers: dict[str, nn.Linear], group: int) -> frozenset:
    """Split the activations between the blocks along the sequence: at the first block's input,
    gathered again at the output head's (``lm_head``) and at the input of each module holding
    column-parallel layers; row-parallel layers scatter their sums along it. Returns the parameters whose gradients are
    then partial on each rank (norms, row-parallel biases: all but the split weights, the
    embeddings and the head), to be summed over the group."""
    name, blocks = _blocks(module, layers)
    head = dict(module.named_modules())["lm_head"]  # checked by _plan
    size = world_size(group)

    def split_input(block, args, kwargs):
        if args:
            return (tp_split_sequence(_dividing(args[0], size), group), *args[1:]), kwargs
        key = next(iter(kwargs))
        return args, {**kwargs, key: tp_split_sequence(_dividing(kwargs[key], size), group)}

    def gather_input(head, args):
        return (tp_gather_sequence(args[0], group), *args[1:])

    blocks[0].register_forward_pre_hook(split_input, with_kwargs=True)
    head.register_forward_pre_hook(gather_input)
    # The module around column-parallel layers (attention, an MLP) reads the sequence length from
    # its input: it gets the whole sequence.
    _enter_at_owners(module, layers, tp_all_gather_sequence, group)
    outside = {id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    outside |= {id(p) for p in head.parameters()}
    split = {id(layer.weight) for layer in layers.values()}
    split |= {
        id(layer.bias)
        for layer in layers.values()
        if isinstance(layer, ColumnParallelLinear) and layer.bias is not None
    }
    return frozenset(
        n
        for n, p in module.named_parameters(remove_duplicate=False)
        if id(p) not in outside | split and p.requires_grad
    )


def _enter_at_owners(module: nn.Module, layers: dict[str, nn.Linear], enter, group: int) -> None:
    """Apply ``enter`` once to the input of each module holding column-parallel layers (not in
    each layer): the layers of one module that read the same input then share one collective."""
    modules = dict(module.named_modules())
    owners = {}
    for name, layer in layers.items():
        if isinstance(layer, ColumnParallelLinear):
            layer.tp_entered_by_owner = True
            owner = modules[name.rpartition(".")[0]]
            owners[id(owner)] = owner

    def hook(owner, args, kwargs):
        if args and isinstance(args[0], torch.Tensor):
            return (enter(args[0], group), *args[1:]), kwargs
        key = (
            "hidden_states"
            if "hidden_states" in kwargs
            else next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        )
        return args, {**kwargs, key: enter(kwargs[key], group)}

    for owner in owners.values():
        owner.register_forward_pre_hook(hook, with_kwargs=True)


def _dividing(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[1] % size:
        raise ConfigError(
            f"tensor-parallel: sequence_parallel splits the sequence ({x.shape[1]} tokens) over {size} ranks; "
            "it must divide"
        )
    return x
