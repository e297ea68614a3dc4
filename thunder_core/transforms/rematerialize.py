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
    outputs, saved = forward.output
    saved = list(saved)
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
    seconds = time.perf_counter() - start
    grads = backward.inputs[len(forward.output[1]) :]
    new_forward = Trace(
        inputs=forward.inputs,
        bound_symbols=forward.bound_symbols,
        output=(outputs, tuple(saved)),
        function_name=forward.function_name,
        provenance=Provenance("rematerialize", seconds),
    )
    new_backward = Trace(
        inputs=[*saved, *grads],
        bound_symbols=_before_first_use(recomputed, backward.bound_symbols, backward.output),
        output=backward.output,
        function_name=backward.function_name,
        provenance=Provenance("rematerialize", seconds),
    )
    return new_forward, new_backward


def _before_first_use(recomputed: list, bsyms: list, output) -> list:
    """``bsyms`` with each recomputed op inserted just before the first op (or the return) reading it."""
    producer = {p.name: b for b in recomputed for p in b.flat_outputs()}
    placed: set[int] = set()
    result: list = []

    def place(reads) -> None:
        for p in reads:
            needed = producer.get(p.name)
            if needed is not None and id(needed) not in placed:
                placed.add(id(needed))
                place(needed.flat_args())
                result.append(needed)

    for bsym in bsyms:
        place(bsym.flat_args())
        result.append(bsym)
    place(x for x in leaves(output) if isinstance(x, TensorProxy))
    return result
