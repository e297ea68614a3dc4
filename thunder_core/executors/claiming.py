"""Assigning bound symbols to executors.

Pre: a trace of torch-level bound symbols (with decompositions as subsymbols). Post: an
execution trace in which every bound symbol names the executor that runs it.
"""

from __future__ import annotations

import time

from thunder_core.executors import torch_executor
from thunder_core.ir.symbols import PYTHON
from thunder_core.ir.trace import Provenance, Trace


def assign_executors(trace: Trace) -> Trace:
    start = time.perf_counter()
    claimed = []
    for bsym in trace.bound_symbols:
        if bsym.symbol.has_tag(PYTHON):
            claimed.append(bsym.replace(executor="python"))
        else:
            claimed.append(torch_executor.claim(bsym))
    return trace.with_bound_symbols(claimed, Provenance("assign_executors", time.perf_counter() - start))
