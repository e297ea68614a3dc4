"""Free every intermediate right after its last use.

Pre: an execution trace (executors assigned). Post: the same computation with ``del``
statements (run by the python executor) after the last read of each value that is not
an output, so peak memory follows the live set, not the whole trace. Numbers are not
deleted: they hold no memory, and an int named as a size symbol (``s0``, a region's int
input) is read by every later size expression that prints it.
"""

from __future__ import annotations

import time

from thunder_core.ir.proxies import NumberProxy, is_proxy
from thunder_core.ir.symbols import BoundSymbol, delete_symbol
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ir.tree import leaves


def delete_last_used(trace: Trace) -> Trace:
    start = time.perf_counter()
    outputs = {x.name for x in leaves(trace.output) if is_proxy(x)}
    seen: set[str] = set(outputs)
    result: list[BoundSymbol] = []
    for bsym in reversed(trace.bound_symbols):
        dead = []
        for proxy in bsym.flat_args() + bsym.flat_outputs():
            if proxy.name not in seen:
                seen.add(proxy.name)
                if type(proxy) is not NumberProxy:
                    dead.append(proxy)
        if dead:
            result.append(BoundSymbol(delete_symbol, tuple(dead), {}, None, executor="python"))
        result.append(bsym)
    result.reverse()
    return trace.with_bound_symbols(result, Provenance("delete_last_used", time.perf_counter() - start))
