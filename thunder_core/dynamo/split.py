"""Splitting a Dynamo FX graph into the parts thunder_core captures and the rest.

A node is thunder_core's when capture would record it as a thunder_core symbol (a registered
torch-level op, a Tensor method or operator that maps to one, or Python bookkeeping such as
``getitem``); a node capture would only run as an opaque torch call is not. Partitions are
contiguous runs in graph order, so a split happens only where support flips.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch import fx

from thunder_core.ops.registry import lookup, torch_path

# Python-level nodes Dynamo emits that capture handles without a symbol of their own (PyTorch's
# usage logging included: it reads no tensor and changes nothing the program sees).
_BOOKKEEPING = {operator.getitem, getattr, len, tuple, list, isinstance, torch._C._log_api_usage_once}
# Grad mode switched for the nodes after it (Dynamo emits it where a ``no_grad`` block starts and
# ends, only when the mode changes): the switch runs as it is, in a part of the fallback, so that
# every part after it is called in that mode, as eager would; a part's program does not switch
# the caller's mode (capture keeps a ``no_grad`` block's effect inside the program it records).
GRAD_MODE_SWITCHES = {torch._C._set_grad_enabled}
# An autocast block's start and end: FX's split_module repeats them in every part the block
# spans, so each part turns autocast on or off and back itself; capture records the casts made
# in between.
_AUTOCAST_BLOCKS = {torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast}
# Tensor methods that answer from metadata (sizes, possibly symbolic): capture reads them off the proxy.
_METADATA_METHODS = {
    "numel",
    "nelement",
    "size",
    "dim",
    "ndimension",
    "stride",
    "is_contiguous",
    "element_size",
}
# Arithmetic on sizes (``sum(sizes)`` becomes ``torch.sym_sum``): capture computes it on Python ints or SymInts.
_SIZE_ARITHMETIC = {
    getattr(torch, name)
    for name in ("sym_sum", "sym_max", "sym_min", "sym_int", "sym_float", "sym_not", "sym_ite", "sym_sqrt")
    if hasattr(torch, name)
}
_OPERATOR_DUNDERS = {
    operator.add: "__add__", operator.sub: "__sub__", operator.mul: "__mul__", operator.truediv: "__truediv__",
    operator.floordiv: "__floordiv__", operator.mod: "__mod__", operator.pow: "__pow__", operator.matmul: "__matmul__",
    operator.neg: "__neg__", operator.pos: "__pos__", operator.abs: "__abs__", operator.invert: "__invert__",
    operator.and_: "__and__", operator.or_: "__or__", operator.xor: "__xor__", operator.lt: "__lt__",
    operator.le: "__le__", operator.gt: "__gt__", operator.ge: "__ge__", operator.eq: "__eq__", operator.ne: "__ne__",
    operator.lshift: "__lshift__", operator.rshift: "__rshift__", operator.iadd: "__iadd__", operator.imul: "__imul__",
    operator.isub: "__isub__", operator.itruediv: "__itruediv__",
}  # fmt: skip


@dataclass
class SplitReason:
    """Why a node is not thunder_core's."""

    node: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.target}): {self.reason}"


@dataclass
class Partition:
    """A contiguous run of nodes with one owner: ``"thunder_core"`` or the fallback."""

    name: str
    owner: str
    nodes: list[str] = field(default_factory=list)
    reasons: list[SplitReason] = field(default_factory=list)


def _target_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return f"Tensor.{target}" if node.op == "call_method" else target
    return torch_path(target) or getattr(target, "__qualname__", None) or repr(target)


def is_inplace_view(name: str) -> bool:
    """``t_``, ``unsqueeze_``, ``as_strided_``, ``detach_``...: ATen tags them ``inplace_view``
    (they change a tensor's sizes, strides or autograd history, not its values)."""
    packet = getattr(torch.ops.aten, name, None) if name.endswith("_") else None
    overloads = packet.overloads() if isinstance(packet, torch._ops.OpOverloadPacket) else ()
    return any(torch.Tag.inplace_view in getattr(packet, o).tags for o in overloads)


def _updates_in_place_what_a_symbol_computes(name: str) -> bool:
    """``x.index_copy_(...)`` when ``x.index_copy`` is a thunder_core symbol: capture records the
    update as an in-place call that the torch executor runs (as ``jit`` does), in the part
    around it. Splitting the graph there would only add a fallback part and a part boundary
    (each with its own call overhead) around an operation the fallback runs the same way. An
    in-place view is left to the fallback: capture refuses a change of sizes."""
    if not name.endswith("_") or name.startswith("_") or is_inplace_view(name):
        return False
    return lookup(getattr(torch.Tensor, name[:-1], None)) is not None


def support(node: fx.Node) -> SplitReason | None:
    """None if thunder_core captures ``node`` as its own symbol(s), else why not."""
    if node.op in ("placeholder", "output", "get_attr"):
        return None
    if node.op == "call_module":
        return None  # a submodule's forward is captured op by op
    target = node.target
    if node.op == "call_method":
        method = getattr(torch.Tensor, target, None)
        if (method is not None and lookup(method) is not None) or target in _METADATA_METHODS:
            return None
        if _updates_in_place_what_a_symbol_computes(target):
            return None
        return SplitReason(node.name, _target_name(node), "no thunder_core symbol for this Tensor method")
    if target in _BOOKKEEPING or target in _AUTOCAST_BLOCKS:
        return None
    if target in GRAD_MODE_SWITCHES:
        return SplitReason(node.name, _target_name(node), "switches grad mode for the parts after it")
    if target in _SIZE_ARITHMETIC and not any(
        isinstance(n.meta.get("example_value"), torch.Tensor) for n in node.all_input_nodes
    ):
        return None
    dunder = _OPERATOR_DUNDERS.get(target)
    if dunder is not None:
        if any(
            isinstance(a, fx.Node) and isinstance(a.meta.get("example_value"), torch.Tensor)
            for a in node.args
        ):
            return (
                None
                if lookup(getattr(torch.Tensor, dunder, None)) is not None
                else SplitReason(node.name, _target_name(node), f"no thunder_core symbol for Tensor.{dunder}")
            )
        return None  # arithmetic on Python numbers (sizes)
    if lookup(target) is not None:
        return None
    if getattr(target, "__module__", "") in ("math", "builtins", "_operator"):
        return None
    return SplitReason(
        node.name, _target_name(node), "no thunder_core symbol: capture could only run it as an opaque call"
    )


def _starts_a_torch_func_transform(node: fx.Node) -> bool:
    """``torch._C._functorch._vmap_increment_nesting`` and its kin: Dynamo's graph of a function
    that calls ``torch.func.vmap`` / ``grad`` / ``jvp`` inside."""
    target = node.target
    return (
        node.op == "call_function"
        and getattr(target, "__module__", "") in ("torch._C._functorch", "torch._functorch.predispatch")
        and getattr(target, "__name__", "").endswith("_increment_nesting")
    )


def partition(gm: fx.GraphModule) -> tuple[dict[fx.Node, int], list[Partition]]:
    """Each computing node's partition id, and the partitions in graph order. A graph that runs a
    torch.func transform is one fallback part: its operations act on the transform's batched or
    differentiated tensors, which exist only between the transform's start and end."""
    transform = next((n for n in gm.graph.nodes if _starts_a_torch_func_transform(n)), None)
    assignment: dict[fx.Node, int] = {}
    partitions: list[Partition] = []
    attributes = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":  # constants and subgraphs travel with their first consumer
            attributes.append(node)
            continue
        reason = support(node)
        if reason is None and transform is not None:
            reason = SplitReason(
                node.name, _target_name(node), f"inside the torch.func transform that {transform.name} starts"
            )
        owner = "thunder_core" if reason is None else "fallback"
        source = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(source, fx.Node) and source in assignment:
            owner = partitions[assignment[source]].owner  # unpacking stays with what it unpacks
        if not partitions or partitions[-1].owner != owner:
            partitions.append(Partition(f"submod_{len(partitions)}", owner))
        partitions[-1].nodes.append(node.name)
        if reason is not None:
            partitions[-1].reasons.append(reason)
        assignment[node] = len(partitions) - 1
    for node in attributes:
        consumers = [assignment[user] for user in node.users if user in assignment]
        index = min(consumers) if consumers else len(partitions) - 1
        if index < 0:  # a graph of constants only
            partitions.append(Partition(f"submod_{len(partitions)}", "fallback"))
            index = 0
        assignment[node] = index
        partitions[index].nodes.append(node.name)
    return assignment, partitions
