"""Compiling each distinct repeated block once (the idea of PyTorch/XLA's ``scan_layers``).

Capture records each call of a repeated block (a transformer layer) as a ``block`` bound
symbol with the layer's operations as subsymbols (``thunder_core.capture.blocks``). Here the
calls are grouped by what they really did: two calls are the same block when their
operations, argument values and the metadata of every tensor they touch match, position by
position. Each distinct block becomes a trace of its own that goes through autodiff,
rematerialization, executor claiming and fusion once; every call of it in the program is
one bound symbol running that compiled block on its own layer's parameters. The printed
program keeps one call per layer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from thunder_core.autodiff.joint import requires_autodiff, split_forward_backward
from thunder_core.capture.blocks import BLOCK, inline_blocks
from thunder_core.capture.recorder import Namer
from thunder_core.ir.proxies import NumberProxy, ObjectProxy, TensorProxy
from thunder_core.ir.symbols import EFFECT, INPLACE, PROGRAM, BoundSymbol, Symbol, active_recorder, is_impure
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves
from thunder_core.ops.shapes import VIEW_OPS
from thunder_core.transforms.rematerialize import rematerialize
from thunder_core.transforms.replay import all_names
from thunder_core.transforms.updates import updated_in_place

MIN_BLOCK_OPS = 4  # a smaller repeated module is not worth a call boundary (it would stop fusion)


@dataclass
class BlockProgram:
    """One distinct block: its traces, its compiled callables and the calls that use it."""

    name: str
    module_class: str
    calls: int
    traces: list[Trace] = field(default_factory=list)
    backward_traces: list[Trace] = field(default_factory=list)
    invariant_traces: list[Trace] = field(default_factory=list)  # computed once for every call


# Argument values compared by value; the trace holds every other object alive, so ids are unique.
_PROGRAM = frozenset({PROGRAM})  # the tag of a call of a block's compiled program

_BY_VALUE = (bool, int, float, complex, str, type(None), type(Ellipsis), torch.dtype, torch.device,
             torch.memory_format, torch.layout, enum.Enum)  # fmt: skip


def _canonical(value, index: dict[str, int]):
    if isinstance(value, TensorProxy):
        position = index.setdefault(value.name, len(index))
        return (
            "T",
            position,
            tuple(value.shape),
            value.stride(),
            value.dtype,
            value.device,
            value.requires_grad,
        )
    if isinstance(value, NumberProxy):
        return ("N", index.setdefault(value.name, len(index)), type(value.value), repr(value.value))
    if isinstance(value, ObjectProxy):
        return ("O", index.setdefault(value.name, len(index)))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_canonical(v, index) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _canonical(v, index)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", _canonical((value.start, value.stop, value.step), index))
    if isinstance(value, _BY_VALUE):  # repr tells -0.0 from 0.0 and keeps NaN equal to NaN
        return (type(value), repr(value))
    return (type(value), id(value))  # anything else (a function, an object) by identity


def structural_key(inputs: list, bsyms: list[BoundSymbol], outputs: list) -> tuple:
    """Equal for two blocks exactly when one's trace, renamed, is the other's."""
    index: dict[str, int] = {}
    parts = [tuple(_canonical(p, index) for p in inputs)]
    for b in bsyms:
        parts.append(
            (
                id(b.symbol),
                _canonical(b.args, index),
                _canonical(b.kwargs, index),
                _canonical(b.output, index),
            )
        )
    parts.append(tuple(_canonical(p, index) for p in outputs))
    return tuple(parts)


def _last_uses(trace: Trace) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, b in enumerate(trace.bound_symbols):
        for sub in b.subsymbols if b.symbol.has_tag(BLOCK) else (b,):
            for p in sub.flat_args():
                last[p.name] = i
    for p in leaves(trace.output):
        if hasattr(p, "name"):
            last[p.name] = len(trace.bound_symbols)
    return last


def _fresh(like):
    recorder = active_recorder()
    if isinstance(like, TensorProxy):
        return recorder.new_proxy(like.shape, like.dtype, like.device, like.requires_grad, like.stride())
    if isinstance(like, NumberProxy):
        return NumberProxy(recorder.namer(), like.value)
    return ObjectProxy(recorder.namer())


class _Group:
    def __init__(self, name: str, module_class: str, inputs: list, bsyms: list[BoundSymbol], outputs: list):
        self.name = name
        self.module_class = module_class
        self.body = Trace(
            inputs=list(inputs), bound_symbols=list(bsyms), output=tuple(outputs), function_name=name
        )
        self.calls: list[int] = []


def _invariant_inputs(calls: list[list]) -> set[str]:
    """Names of the block's arguments that are the same value in every call (an attention mask,
    rotary tables), by the first call's names."""
    first, rest = calls[0], calls[1:]
    return {
        p.name
        for i, p in enumerate(first)
        if hasattr(p, "name") and rest and all(getattr(c[i], "name", None) == p.name for c in rest)
    }


def _hoist_invariants(trace: Trace, invariant: set[str], returned: set[str]) -> tuple[Trace, Trace | None]:
    """Split off the operations of a block's trace that compute the same value in every call.

    An operation whose arguments are all ``invariant`` (or computed from them alone), with no
    effect and nothing that requires a gradient, gives every layer the same value: a boolean
    attention mask made additive, say, which autodiff's attention rule adds to each layer and
    the backward reads. Returns the block's trace taking those values as extra inputs (after
    its own), and the trace computing them once (None when there is nothing worth it: only
    views, or a value the block returns).
    """
    constant = set(invariant)
    hoisted, kept, constants = [], [], {}
    for bsym in trace.bound_symbols:
        args, outputs = bsym.flat_args(), bsym.flat_outputs()
        movable = (
            outputs
            and all(isinstance(p, TensorProxy) for p in outputs)
            and all(p.name in constant for p in args)
            and not any(is_impure(b) for b in (bsym, *bsym.subsymbols))
            and not any(getattr(p, "requires_grad", False) for p in (*args, *outputs))
        )
        if movable and not args:
            # A constant (``zeros``, say) goes out only with what reads it, and stays for the block's
            # own reads: in a fused kernel it costs nothing, as an extra input a read per call.
            constants.update((p.name, bsym) for p in outputs)
            kept.append(bsym)
        elif movable:
            hoisted.append(bsym)
        else:
            kept.append(bsym)
        if movable:
            constant.update(p.name for p in outputs)
    computed = {id(b) for b in hoisted}
    used = {id(constants[p.name]) for b in hoisted for p in b.flat_args() if p.name in constants}
    returned_or_read = returned | {p.name for p in leaves(trace.output) if hasattr(p, "name")}
    read_inside = returned_or_read | {p.name for b in kept for p in b.flat_args()}
    kept = [b for b in kept if id(b) not in used or any(p.name in read_inside for p in b.flat_outputs())]
    defined_inside = {p.name for b in kept for p in b.flat_outputs()}
    made = {p.name: p for b in hoisted for p in b.flat_outputs() if p.name not in defined_inside}
    hoisted = [b for b in trace.bound_symbols if id(b) in computed or id(b) in used]
    if not made or made.keys() & returned or all(b.symbol.name in VIEW_OPS for b in hoisted if b.flat_args()):
        return trace, None  # a value the block returns, or nothing but views: left as it is
    extra = [p for name, p in made.items() if name in read_inside]
    if not extra:
        return trace, None
    hoisted_reads = {p.name for b in hoisted for p in b.flat_args()}
    invariants = Trace(
        inputs=[p for p in trace.inputs if p.name in hoisted_reads],
        bound_symbols=hoisted,
        output=tuple(extra),
        function_name=f"{trace.function_name}_invariants",
    )
    block = Trace(
        inputs=[*trace.inputs, *extra],
        bound_symbols=kept,
        output=trace.output,
        function_name=trace.function_name,
        provenance=trace.provenance,
    )
    return block, invariants


@dataclass
class _Hoisted:
    """What a block's calls compute alike: the symbol computing it once, which of the block's
    arguments it reads (positions), and the values it gives (the block's extra arguments)."""

    symbol: Symbol
    positions: list[int]
    values: tuple


def _named(traces: list[Trace], name: str) -> list[Trace]:
    """A block's lowered traces, named after it (``block_1_forward``): what the generated functions
    and their profiler ranges are called."""
    for trace in traces:
        trace.function_name = name
    return traces


def _hoisted(
    group: _Group, invariants: Trace | None, lower, inputs: list
) -> tuple[_Hoisted, list[Trace]] | None:
    """The symbol computing ``invariants`` once (lowered for the job), and its traces."""
    if invariants is None:
        return None
    traces = _named(lower(invariants), f"{group.name}_invariants")
    run = traces[-1].python_callable()
    name = f"{group.name}_invariants"
    symbol = Symbol(name=name, impl=lambda *args: tuple(run(*args)), printed_name=name, tags=_PROGRAM)
    position = {p.name: i for i, p in enumerate(inputs)}
    return _Hoisted(symbol, [position[p.name] for p in invariants.inputs], invariants.output), [
        invariants,
        *traces,
    ]


def _compile_group(group: _Group, lower, job_executors, invariant: set[str] = frozenset()):
    """The symbol that calls the compiled block, with the VJP rule autodiff uses on it; its
    program; and what its calls compute alike (``_Hoisted``, or None)."""
    body = group.body
    program = BlockProgram(group.name, group.module_class, len(group.calls))
    n_out = len(body.output)
    original_inputs = list(body.inputs)
    if not requires_autodiff(body):
        returned = {p.name for p in leaves(body.output) if hasattr(p, "name")}
        body, invariants = _hoist_invariants(body, invariant, returned)
        hoisted, program.invariant_traces = _hoisted(group, invariants, lower, original_inputs) or (None, [])
        traces = _named(lower(body), group.name)
        program.traces = [group.body, *traces]
        run = traces[-1].python_callable()
        return Symbol(name=group.name, impl=run, printed_name=group.name, tags=_PROGRAM), program, hoisted

    with torch.enable_grad():  # the gradient's own ops are recorded as grad mode on
        split = split_forward_backward(body, job_executors)
    forward, backward = rematerialize(split.forward, split.backward)
    returned = {p.name for p in leaves(forward.output[0]) if hasattr(p, "name")}
    forward, invariants = _hoist_invariants(forward, invariant, returned)
    hoisted, program.invariant_traces = _hoisted(group, invariants, lower, original_inputs) or (None, [])
    forward_traces = _named(lower(forward), f"{group.name}_forward")
    backward_traces = _named(lower(backward), f"{group.name}_backward")
    program.traces = [body, split.forward, *forward_traces]
    program.backward_traces = [split.backward, *backward_traces]
    run_forward = forward_traces[-1].python_callable()
    run_backward = backward_traces[-1].python_callable()
    outputs_like, saved_like = forward.output
    differentiable = split.output_differentiable
    # A saved value that is one of the block's own inputs (a weight) is handed to the backward
    # by the caller, not returned by the block: the program around the block sees where it comes
    # from (rematerialization may recompute it, e.g. gather a sharded weight again).
    input_position = {p.name: i for i, p in enumerate(forward.inputs)}
    saved_source = [input_position.get(getattr(p, "name", None)) for p in saved_like]
    returned = [j for j, source in enumerate(saved_source) if source is None]
    saved_returned_like = [saved_like[j] for j in returned]

    def forward_and_saved(*args):
        outputs, saved = run_forward(*args)
        return (*outputs, *(saved[j] for j in returned))

    def outputs_only(*args):
        return tuple(run_forward(*args)[0])

    forward_symbol = Symbol(
        name=f"{group.name}_forward",
        impl=forward_and_saved,
        printed_name=f"{group.name}_forward",
        tags=_PROGRAM,
        meta=lambda *args: tuple(_fresh(p) for p in (*outputs_like, *saved_returned_like)),
    )
    grads_like = backward.output
    backward_symbol = Symbol(
        name=f"{group.name}_backward",
        impl=lambda *args: tuple(run_backward(*args)),
        printed_name=f"{group.name}_backward",
        tags=_PROGRAM,
        meta=lambda *args: tuple(None if g is None else _fresh(g) for g in grads_like),
    )

    def vjp(*args):
        results = forward_symbol(*args)
        outputs, returned_saved = results[:n_out], iter(results[n_out:])
        saved = [next(returned_saved) if source is None else args[source] for source in saved_source]

        def pullback(grads):
            from thunder_core.autodiff.helpers import ops

            grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
            given = []
            for out, g, is_diff in zip(outputs, grads, differentiable):
                if is_diff:
                    given.append(g if g is not None else ops.zeros_like(out))
            input_grads = backward_symbol(*saved, *given)
            return [(arg, g) for arg, g in zip(args, input_grads) if g is not None]

        return tuple(outputs), pullback

    symbol = Symbol(name=group.name, impl=outputs_only, printed_name=group.name, vjp=vjp, tags=_PROGRAM)
    return symbol, program, hoisted


def share_blocks(trace: Trace, lower, job_executors=()) -> tuple[Trace, list[BlockProgram]]:
    """Replace recorded block calls by calls of one compiled program per distinct block.

    ``lower(trace)`` gives the lowered traces of a block's (forward or backward) trace. A block
    that mutates a tensor in place, produces nothing used later, or is smaller than
    ``MIN_BLOCK_OPS`` operations is inlined. Raises what autodiff raises
    (``NotDifferentiable``): the caller then compiles the inlined program instead.
    """
    last_uses = _last_uses(trace)
    groups: dict[tuple, _Group] = {}
    plan: list = []  # per bound symbol: a BoundSymbol to keep, a list to inline, or (group, inputs, outputs)
    for position, bsym in enumerate(trace.bound_symbols):
        if not bsym.symbol.has_tag(BLOCK):
            plan.append(bsym)
            continue
        inner = bsym.subsymbols
        produced = [p for b in inner for p in b.flat_outputs()]
        outputs = list({p.name: p for p in produced if last_uses.get(p.name, -1) > position}.values())
        if (
            len(inner) < MIN_BLOCK_OPS
            or not outputs
            or any(b.symbol.has_tag(INPLACE) or b.symbol.has_tag(EFFECT) for b in inner)
        ):
            plan.append(list(inner))
            continue
        inputs = list(bsym.args)
        key = structural_key(inputs, inner, outputs)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(
                f"block_{len(groups) + 1}",
                bsym.symbol.printed_name.removeprefix("block_of_"),
                inputs,
                inner,
                outputs,
            )
        group.calls.append(position)
        plan.append((group, inputs, outputs, bsym.source))

    namer = Namer(all_names(trace))
    symbols, programs, hoists = {}, [], {}
    for group in groups.values():
        calls = [item[1] for item in plan if isinstance(item, tuple) and item[0] is group]
        # A tensor updated between the first call and the last holds another value in each.
        updated = updated_in_place(trace.bound_symbols, group.calls[0], group.calls[-1])
        shared = _invariant_inputs(calls) - updated
        symbols[id(group)], program, hoisted = _compile_group(group, lower, job_executors, shared)
        programs.append(program)
        if hoisted is not None:  # computed once, before the first call; every call takes the values
            values = tuple(
                TensorProxy(namer(), p.shape, p.dtype, p.device, False, p.stride()) for p in hoisted.values
            )
            args = tuple(calls[0][i] for i in hoisted.positions)
            hoists[id(group)] = BoundSymbol(hoisted.symbol, args, {}, values, [], None)
            for inputs in calls:
                inputs.extend(values)

    bound_symbols: list[BoundSymbol] = []
    for item in plan:
        if isinstance(item, BoundSymbol):
            bound_symbols.append(item)
        elif isinstance(item, list):
            bound_symbols.extend(item)
        else:
            group, inputs, outputs, source = item
            if id(group) in hoists:
                bound_symbols.append(hoists.pop(id(group)))
            bound_symbols.append(
                BoundSymbol(symbols[id(group)], tuple(inputs), {}, tuple(outputs), [], source)
            )
    return trace.with_bound_symbols(bound_symbols, None), programs


def without_blocks(trace: Trace) -> Trace:
    """``trace`` with every recorded block call replaced by its operations."""
    return trace.with_bound_symbols(inline_blocks(trace.bound_symbols), trace.provenance)
