"""Rematerialization: recompute cheap values in backward instead of saving them.

Pre: a forward trace returning ``(outputs, saved)`` and the backward trace taking
``(*saved, *grads)``. Post: the same pair, saving the fewest bytes from which the backward can
recompute everything it reads with cheap elementwise ops and views (``CHEAP``, or a symbol
tagged ``RECOMPUTE``): a minimum cut (networkx) through the graph of those ops between what the
forward must save (values of other ops, random and in-place ones) and what the backward reads,
each saved value weighing its bytes and the forward's inputs nothing. Recomputed ops are placed
in the backward just before their first use, where a fusion executor fuses them with their
consumers, and the forward keeps fewer tensors alive.

A value that both passes read from memory (a matmul's operand in the forward and again in the
backward, such as a normalized activation or an MLP's gated product) is saved: recomputing it
would write it to memory once more, the cost its saving avoids, as in ``torch.compile``'s
partitioner.
"""

from __future__ import annotations

import time

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import INPLACE, RANDOM, RECOMPUTE
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ir.tree import leaves
from thunder_core.ops.shapes import VIEW_OPS
from thunder_core.transforms.updates import updated_in_place

# Torch-level and prim ops cheap enough to recompute (elementwise, no reductions).
CHEAP = frozenset(
    {
        "add", "sub", "mul", "div", "neg", "exp", "tanh", "sigmoid", "relu", "gelu", "silu", "rsqrt",
        "sqrt", "reciprocal", "to", "float", "half", "bfloat16", "type_as", "convert_element_type",
        "where", "masked_fill", "pow", "square", "broadcast_in_dim", "reshape", "view", "expand",
        "transpose", "permute", "unsqueeze", "squeeze", "contiguous", "logical_not", "rsub", "zeros",
        "zeros_like", "ones_like", "full", "full_like",
    }
)  # fmt: skip

# Ops a fusion executor computes from registers: an operand they alone read need not be in memory.
FUSED_READERS = CHEAP | frozenset(
    {"sum", "mean", "amax", "amin", "var", "std", "softmax", "log_softmax", "cat", "split", "getitem"}
)


def _is_cheap(bsym) -> bool:
    symbol = bsym.symbol
    if symbol.has_tag(RECOMPUTE):
        return True
    return symbol.name in CHEAP and not symbol.has_tag(INPLACE) and not symbol.has_tag(RANDOM)


def _materialized(bsyms, output) -> set[str]:
    """Names of the values some operation of ``bsyms`` (or the trace's return) reads from memory:
    an operand of an op outside ``FUSED_READERS``, or the base of such an operand's view."""
    result = {p.name for p in leaves(output) if isinstance(p, TensorProxy)}
    for bsym in reversed(bsyms):
        outputs = bsym.flat_outputs()
        if not any(isinstance(p, TensorProxy) for p in outputs):
            continue  # a deletion, a print, a return: no operand of a computation
        name = bsym.symbol.name
        if name in VIEW_OPS:
            if any(p.name in result for p in outputs):
                result.update(p.name for p in bsym.flat_args() if isinstance(p, TensorProxy))
        elif name not in FUSED_READERS:
            result.update(p.name for p in bsym.flat_args() if isinstance(p, TensorProxy))
    return result


def rematerialize(forward: Trace, backward: Trace) -> tuple[Trace, Trace]:
    start = time.perf_counter()
    needed = {p.name: p for p in forward.output[1] if isinstance(p, TensorProxy)}
    if not needed:
        return forward, backward
    producers = {p.name: b for b in forward.bound_symbols for p in b.flat_outputs()}
    inputs = {p.name for p in forward.inputs}
    read_from_memory = _materialized(forward.bound_symbols, forward.output[0]) & _materialized(
        backward.bound_symbols, backward.output
    )

    updated = updated_in_place(forward.bound_symbols)  # recomputed later, they would read the update

    def recomputable(name: str) -> bool:
        bsym = producers.get(name)
        return (
            bsym is not None
            and _is_cheap(bsym)
            and not _must_save(bsym)
            and len(bsym.flat_outputs()) == 1
            and (bsym.symbol.has_tag(RECOMPUTE) or name not in read_from_memory)
            and not any(p.name in updated for p in bsym.flat_args())
        )

    import networkx  # here: 0.1 s to import, and only training needs it

    graph = networkx.DiGraph()
    graph.add_node("source")  # nothing may need saving: everything computed from constants
    stack, seen = list(needed.values()), set(needed)
    while stack:
        proxy = stack.pop()
        name = proxy.name
        # Ties go to saving what the backward reads (nothing recomputed for nothing).
        weight = 0 if name in inputs else 2 * proxy.size_hint_bytes + (name not in needed)
        graph.add_edge(("in", name), ("out", name), capacity=weight)
        if name in needed:
            graph.add_edge(("out", name), "sink")  # no capacity: unbounded
        if name in inputs or not recomputable(name):
            graph.add_edge("source", ("in", name))
            continue
        for arg in producers[name].flat_args():
            if isinstance(arg, TensorProxy):
                graph.add_edge(("out", arg.name), ("in", name))
                if arg.name not in seen:
                    seen.add(arg.name)
                    stack.append(arg)
    _, (source_side, _) = networkx.minimum_cut(graph, "source", "sink")
    saved = {node[1] for node in source_side if node[0] == "in" and ("out", node[1]) not in source_side}
    result = recompute_in_backward(forward, backward, lambda proxy, bsym: proxy.name in saved)
    if result[0] is forward:
        return forward, backward
    provenance = Provenance("rematerialize", time.perf_counter() - start)
    for trace in result:
        trace.provenance = provenance
    return result


def _with_saved(forward: Trace, backward: Trace, saved, recomputed: list, provenance) -> tuple[Trace, Trace]:
    """The pair with the forward saving ``saved`` and the backward recomputing ``recomputed``
    (in forward order), each just before its first use."""
    grads = backward.inputs[len(forward.output[1]) :]
    new_forward = Trace(
        inputs=forward.inputs,
        bound_symbols=forward.bound_symbols,
        output=(forward.output[0], tuple(saved)),
        function_name=forward.function_name,
        provenance=provenance,
    )
    new_backward = Trace(
        inputs=[*saved, *grads],
        bound_symbols=_before_first_use(recomputed, backward.bound_symbols, backward.output),
        output=backward.output,
        function_name=backward.function_name,
        provenance=provenance,
    )
    return new_forward, new_backward


def recompute_in_backward(forward: Trace, backward: Trace, keep) -> tuple[Trace, Trace]:
    """Save only what ``keep`` says and recompute the rest of the saved values in the backward.

    ``keep(proxy, producer)`` decides for each tensor the backward reads from the forward (and
    for the values those are recomputed from): True saves it, False recomputes it from its
    producer's inputs, each recomputed op placed just before the first backward op reading it.
    Forward inputs are always available; the outputs of random, in-place and handle-producing
    ops are always saved (recomputing them would draw other numbers or repeat a side effect),
    as are values computed from a tensor the forward updates in place (``updated_in_place``).
    Activation checkpointing is this with a policy for ``keep``.
    """
    start = time.perf_counter()
    saved = forward.output[1]
    producers, position = {}, {}
    for i, bsym in enumerate(forward.bound_symbols):
        for p in bsym.flat_outputs():
            producers[p.name] = bsym
        position[id(bsym)] = i
    inputs = {p.name for p in forward.inputs}
    updated = updated_in_place(forward.bound_symbols)
    new_saved, saved_names, recomputed, seen = [], set(), [], set()

    def save(proxy) -> None:
        if proxy.name not in saved_names:
            saved_names.add(proxy.name)
            new_saved.append(proxy)

    stack = list(reversed(saved))
    while stack:  # iterative: a chain of recomputed ops can be as long as the forward
        proxy = stack.pop()
        if not isinstance(proxy, TensorProxy) or proxy.name in inputs:
            save(proxy)
            continue
        bsym = producers.get(proxy.name)
        if bsym is None or _must_save(bsym) or any(p.name in updated for p in bsym.flat_args()):
            save(proxy)  # made by an op that cannot run again, or from a value updated later
            continue
        if keep(proxy, bsym):
            save(proxy)
            continue
        if id(bsym) in seen:
            continue
        seen.add(id(bsym))
        recomputed.append(bsym)
        stack.extend(reversed(bsym.flat_args()))
    if not recomputed:
        return forward, backward
    recomputed.sort(key=lambda b: position[id(b)])
    provenance = Provenance("recompute in backward", time.perf_counter() - start)
    return _with_saved(forward, backward, new_saved, recomputed, provenance)


def _must_save(bsym) -> bool:
    symbol = bsym.symbol
    if symbol.has_tag(INPLACE) or symbol.has_tag(RANDOM):
        return True
    return any(not isinstance(p, TensorProxy) for p in bsym.flat_outputs())


def _before_first_use(recomputed: list, bsyms: list, output) -> list:
    """``bsyms`` with each recomputed op inserted just before the first op (or the return) reading
    it, its own recomputed inputs first (iterative: a chain can be as long as the forward)."""
    producer = {p.name: b for b in recomputed for p in b.flat_outputs()}
    placed: set[int] = set()
    result: list = []

    def place(reads) -> None:
        stack = [(producer[p.name], False) for p in reads if p.name in producer]
        stack.reverse()
        while stack:
            bsym, ready = stack.pop()
            if id(bsym) in placed:
                continue
            if ready:
                placed.add(id(bsym))
                result.append(bsym)
                continue
            stack.append((bsym, True))
            deps = [producer[p.name] for p in bsym.flat_args() if p.name in producer]
            stack.extend((d, False) for d in reversed(deps) if id(d) not in placed)

    for bsym in bsyms:
        place(bsym.flat_args())
        result.append(bsym)
    place(x for x in leaves(output) if isinstance(x, TensorProxy))
    return result
