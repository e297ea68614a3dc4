"""Looking inside a jitted function: its traces and its cache."""

from __future__ import annotations

from thunder_core.ir.trace import Trace
from thunder_core.jit.function import CacheInfo, ThunderFunction
from thunder_core.jit.module import ThunderModule


def _function(jfn) -> ThunderFunction:
    if isinstance(jfn, ThunderModule):
        return jfn._forward
    if isinstance(jfn, ThunderFunction):
        return jfn
    raise TypeError(
        f"expected a function or module returned by thunder_core.jit, got {type(jfn).__qualname__}"
    )


def _last(jfn):
    compiled = _function(jfn).last_compiled()
    if compiled is None:
        raise RuntimeError(
            "this jitted function has not been called yet: call it once, then ask for its traces"
        )
    return compiled


def last_traces(jfn) -> list[Trace]:
    """The traces of the most recent call, from capture to the one executed.

    Each trace's ``provenance`` says which pass made it and how long the pass took. When the
    call needed gradients, the forward traces (ending with the executed ``forward``) are
    followed by the backward traces (ending with the executed ``backward``); see also
    ``last_backward_traces``.
    """
    compiled = _last(jfn)
    return [*compiled.traces, *compiled.backward_traces]


def last_backward_traces(jfn) -> list[Trace]:
    """The backward traces of the most recent call ([] when it needed no gradients)."""
    return list(_last(jfn).backward_traces)


def cache_info(jfn) -> CacheInfo:
    """Hits, misses and entries of a jitted function's cache of compiled traces."""
    return _function(jfn).cache_info()
