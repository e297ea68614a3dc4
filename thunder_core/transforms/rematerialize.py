"""Rematerialization: recompute cheap values in backward instead of saving them.

Pre: a forward trace returning ``(outputs, saved)`` and the backward trace taking
``(*saved, *grads)``. Post: the same pair, where a saved value made by one cheap
elementwise op (or a symbol tagged ``RECOMPUTE``) whose tensor inputs are all saved anyway
(or forward inputs) is recomputed
in the backward instead, just before its first use (so a fusion executor can fuse the
recomputation with its consumers), and the forward keeps fewer tensors alive.
"""

from __future__ import annotations

import time

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import INPLACE, RANDOM, RECOMPUTE
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ir.tree import leaves

# Torch-level and prim ops cheap enough to recompute (elementwise, no reductions).
CHEAP = frozenset(
    {
        "add", "sub", "mul", "div", "neg", "exp", "tanh", "sigmoid", "relu", "gelu", "silu", "rsqrt",
        "sqrt", "reciprocal", "to", "float", "half", "bfloat16", "type_as", "convert_element_type",
        "where", "masked_fill", "pow", "square", "broadcast_in_dim", "reshape", "view", "expand",
        "transpose", "permute", "unsqueeze", "squeeze", "contiguous",
    }
)  # fmt: skip


def _is_cheap(bsym) -> bool:
    symbol = bsym.symbol
    if symbol.has_tag(RECOMPUTE):
        return True
    return symbol.name in CHEAP and not symbol.has_tag(INPLACE) and not symbol.has_tag(RANDOM)


def rematerialize(forward: Trace, backward: Trace) -> tuple[Trace, Trace]:
    start = time.perf_counter()
    saved = list(forward.output[1])
    producers = {}
    for bsym in forward.bound_symbols:
        for p in bsym.flat_outputs():
            producers[p.name] = bsym
    inputs = {p.name for p in forward.inputs}
    recomputed = []
    changed = True
    while changed:
        changed = False
        available = inputs | {p.name for p in saved}
        for proxy in list(saved):
            bsym = producers.get(proxy.name)
            if bsym is None or not _is_cheap(bsym) or not isinstance(proxy, TensorProxy):
                continue
            args = [p for p in bsym.flat_args() if isinstance(p, TensorProxy)]
            if len(bsym.flat_outputs()) != 1 or not all(p.name in available for p in args):
                continue
            saved = [s for s in saved if s is not proxy]
            for p in args:
                if p.name not in {s.name for s in saved}:
                    saved.append(p)
            recomputed.append(bsym)
            changed = True
            break
    if not recomputed:
        return forward, backward
    return _with_saved(
        forward, backward, saved, recomputed, Provenance("rematerialize", time.perf_counter() - start)
    )


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
    ops are always saved (recomputing them would draw other numbers or repeat a side effect).
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
        if bsym is None or _must_save(bsym) or keep(proxy, bsym):
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
