"""Dead-code elimination.

Pre: a trace. Post: every bound symbol left either produces a value that the output or
a later kept bound symbol reads, or is impure (``is_impure``: an in-place op, a random draw,
which advances the generator even when its value is unused, or another effect).
"""

from __future__ import annotations

import time

from thunder_core.ir.proxies import is_proxy
from thunder_core.ir.symbols import is_impure
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ir.tree import leaves


def _names(tree) -> set[str]:
    return {x.name for x in leaves(tree) if is_proxy(x)}


def dce(trace: Trace) -> Trace:
    start = time.perf_counter()
    needed = _names(trace.output)
    kept = []
    for bsym in reversed(trace.bound_symbols):
        outputs = {p.name for p in bsym.flat_outputs()}
        if is_impure(bsym) or outputs & needed:
            kept.append(bsym)
            needed |= {p.name for p in bsym.flat_args()}
    kept.reverse()
    return trace.with_bound_symbols(kept, Provenance("dce", time.perf_counter() - start))
