"""Looking inside a jitted function: its traces and its cache."""

from __future__ import annotations

from thunder_core.ir.trace import Trace
from thunder_core.jit.blocks import BlockProgram
from thunder_core.jit.function import CacheInfo, ThunderFunction
from thunder_core.jit.module import ThunderModule


def _function(jfn) -> ThunderFunction:
    if isinstance(jfn, ThunderModule):
        return jfn._forward
    if isinstance(jfn, ThunderFunction):
        return jfn
    raise TypeError(
        f"expected a function or module returned by thunder_core.jit or by torch.compile(..., "
        f"backend='thunder_core'), got {type(jfn).__qualname__}"
    )


def compile_report(compiled):
    """The report of a ``torch.compile(..., backend="thunder_core")`` object, or None for anything else."""
    if getattr(compiled, "_torchdynamo_orig_callable", None) is None:
        return None
    from thunder_core.dynamo.compiler import report_for

    report = report_for(compiled)
    if report is None:
        raise RuntimeError(
            "this torch.compile-d object has not run through backend='thunder_core' yet: call it once"
        )
    return report


def _last(jfn):
    compiled = _function(jfn).last_compiled()
    if compiled is None:
        raise RuntimeError(
            "this jitted function has not been called yet: call it once, then ask for its traces"
        )
    return compiled


def _last_of_each(jfn) -> list:
    """The most recent compiled entry of ``jfn``, or of each thunder_core part of a
    ``torch.compile(..., backend="thunder_core")`` object that has run."""
    report = compile_report(jfn)
    if report is None:
        return [_last(jfn)]
    return [
        part._forward.last_compiled()
        for _, _, part in report.thunder_parts()
        if part._forward.last_compiled()
    ]


def last_traces(jfn) -> list[Trace]:
    """The traces of the most recent call, from capture to the one executed.

    Each trace's ``provenance`` says which pass made it and how long the pass took. When the
    call needed gradients, the forward traces (ending with the executed ``forward``) are
    followed by the backward traces (ending with the executed ``backward``); see also
    ``last_backward_traces``.
    """
    compiled = _last_of_each(jfn)
    return [t for c in compiled for t in (*c.traces, *c.backward_traces)]


def last_backward_traces(jfn) -> list[Trace]:
    """The backward traces of the most recent call ([] when it needed no gradients)."""
    return [t for c in _last_of_each(jfn) for t in c.backward_traces]


def last_blocks(jfn) -> list[BlockProgram]:
    """The distinct repeated blocks of the most recent call, each compiled once.

    Each has a ``name`` (what the program calls: ``block_1``, or ``block_1_forward`` and
    ``block_1_backward`` when training), the ``module_class`` of its layers, how many
    ``calls`` of it the program makes, and its own ``traces`` and ``backward_traces``.
    Empty when nothing repeated, or with ``jit(..., reuse_blocks=False)``.
    """
    return [b for c in _last_of_each(jfn) for b in c.blocks]


def cache_info(jfn) -> CacheInfo:
    """Hits, misses and entries of a jitted function's cache of compiled traces.

    For a ``torch.compile(..., backend="thunder_core")`` object: those of every thunder_core
    part of the graphs Dynamo handed over, added up (each reason names its graph and part).
    Dynamo's own recompiles, decided by its guards, are in ``thunder_core.explain``.
    """
    report = compile_report(jfn)
    if report is None:
        return _function(jfn).cache_info()
    with report.lock:  # Dynamo may be adding a graph on another thread
        found = report.thunder_parts()
    parts = [(record, name, part._forward.cache_info()) for record, name, part in found]
    return CacheInfo(
        hits=sum(info.hits for _, _, info in parts),
        misses=sum(info.misses for _, _, info in parts),
        entries=sum(info.entries for _, _, info in parts),
        reasons=tuple(
            f"graph {record.index} {name}: {reason}"
            for record, name, info in parts
            for reason in info.reasons
        ),
        disk_hits=sum(info.disk_hits for _, _, info in parts),
    )
