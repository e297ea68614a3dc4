"""Rewriting a trace by replaying it: the tool for transforms that change operations.

``replay(trace, visit)`` records a new trace: for each bound symbol, ``visit(bsym, args,
kwargs)`` is called with the arguments already renamed to the new trace's values, and
returns the new outputs -- usually by calling symbols, which records them (with their
decompositions and fresh metadata). The default visit re-records the same call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from thunder_core.capture.recorder import Namer, Recorder
from thunder_core.ir.proxies import PROXY_TYPES
from thunder_core.ir.symbols import BoundSymbol, pop_recorder, push_recorder
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ir.tree import leaves, tree_map


def all_names(trace: Trace) -> set[str]:
    """Every name a trace's inputs and bound symbols (subsymbols included) define."""
    names = {p.name for p in trace.inputs}

    def visit(bsyms):
        for b in bsyms:
            names.update(p.name for p in b.flat_outputs())
            visit(b.subsymbols)

    visit(trace.bound_symbols)
    return names


def same_call(bsym: BoundSymbol, args: tuple, kwargs: dict):
    """Re-record ``bsym``'s symbol on the (renamed) arguments."""
    return bsym.symbol(*args, **kwargs)


def replay(trace: Trace, visit: Callable = same_call, *, name: str = "replay") -> Trace:
    """A new trace made by calling ``visit(bsym, args, kwargs)`` for each bound symbol of ``trace``.

    ``args``/``kwargs`` are already renamed to the new trace's values; ``visit`` returns the new
    outputs, usually by calling symbols (which records them, with fresh decompositions and
    metadata). The default re-records each call unchanged. A transform that doubles every
    ``exp``::

        def visit(bsym, args, kwargs):
            out = bsym.symbol(*args, **kwargs)
            return get_symbol("mul")(out, 2) if bsym.symbol is get_symbol("exp") else out

        new_trace = replay(trace, visit, name="double-exp")
    """
    start = time.perf_counter()
    recorder = Recorder(Namer(all_names(trace)), top_level=False)
    renamed: dict[int, object] = {}

    def rename(x):
        return renamed.get(id(x), x)

    push_recorder(recorder)
    try:
        for bsym in trace.bound_symbols:
            first = len(recorder.bound_symbols)
            out = visit(bsym, tree_map(rename, bsym.args), tree_map(rename, bsym.kwargs))
            for i in range(first, len(recorder.bound_symbols)):
                recorder.bound_symbols[i] = recorder.bound_symbols[i].replace(source=bsym.source)
            for old, new in zip(leaves(bsym.output), leaves(out)):
                if isinstance(old, PROXY_TYPES) and old is not new:
                    renamed[id(old)] = new
    finally:
        pop_recorder()
    return Trace(
        inputs=trace.inputs,
        bound_symbols=recorder.bound_symbols,
        output=tree_map(rename, trace.output),
        function_name=trace.function_name,
        provenance=Provenance(name, time.perf_counter() - start),
        output_treespec=trace.output_treespec,
    )
