"""``thunder_core.report``: one self-contained HTML file showing what the compiler did.

For a jitted function or module (or a ``torch.compile(..., backend="thunder_core")`` object)
that has run: every stage's trace, the executed ones with each operation coloured by the
executor that runs it and fused regions folded with their operations; time per region and per
executor (forward and backward) measured under ``torch.profiler`` through the ranges the
generated code opens (``thunder_core.ir.codegen.region_name``), eager PyTorch's time for the
same call, peak memory and what each tensor saved for the backward holds; the cache entries
with their guards and the reason for every compile; and, for the torch.compile front end, the
graphs Dynamo handed over, its graph breaks (deduplicated) and the splits. Repeated blocks are
shown once with their number of calls. The page needs no network and no server.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten

from thunder_core.inspection import _function, compile_report
from thunder_core.ir.codegen import Printer, region_name, running_executor
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.tree import leaves
from thunder_core.jit.module import ThunderModule

# Executor colours, assigned in claim order; torch and python have fixed ones.
PALETTE = ["#e4572e", "#2e86ab", "#76b041", "#a846a0", "#f3a712", "#17becf", "#8c564b", "#e377c2"]
FIXED = {"torch": "#7f8c8d", "python": "#bdc3c7", "(decomposed)": "#d5d8dc", "program": "#34495e"}


def report(compiled, *args, path: str | os.PathLike = "report.html", rounds: int = 5, **kwargs) -> Path:
    """Write the HTML report of ``compiled`` to ``path`` and return the path.

    With arguments, the program is first called on them (so it is compiled), then timed against
    eager PyTorch over ``rounds`` interleaved rounds, and profiled once for the time of each
    region; when its result requires grad, the backward of the sum of the outputs' means is part
    of every call (the gradients it leaves on a module's parameters and the arguments are
    restored afterwards).
    Without arguments, the report shows the most recent call's traces and the cache only.
    """
    return report_many([(compiled, args, kwargs)], path=path, rounds=rounds)


def report_many(calls, *, path: str | os.PathLike = "report.html", rounds: int = 5) -> Path:
    """One page for several compiled programs: ``calls`` holds ``(compiled, args, kwargs)``, each
    measured as ``report`` measures one (empty ``args`` and ``kwargs``: not measured)."""
    from thunder_core.report.render import render

    sections = [collect(compiled, args, kwargs, rounds) for compiled, args, kwargs in calls]
    executors: list[str] = []
    for section in sections:
        executors += [e for e in section["executors"] if e not in executors]
    colors: dict[str, str] = {}
    for name in [*executors, *FIXED]:
        colors[name] = FIXED.get(name) or PALETTE[len([c for c in colors if c not in FIXED]) % len(PALETTE)]
    data = {
        "title": ", ".join(s["title"] for s in sections),
        "versions": _versions(),
        "colors": colors,
        "sections": sections,
    }
    path = Path(path)
    path.write_text(render(data), encoding="utf-8")
    return path


def collect(compiled, args: tuple, kwargs: dict, rounds: int) -> dict:
    """Everything the page shows of one compiled program, as plain data (embedded as JSON too)."""
    dynamo = compile_report(compiled)
    measured = _measure(compiled, args, kwargs, rounds) if args or kwargs else None
    parts = (
        [(f"graph {record.index} {name}", part) for record, name, part in dynamo.thunder_parts()]
        if dynamo is not None
        else [("", compiled)]
    )
    executors: list[str] = []
    programs = []
    for label, part in parts:
        function = _function(part)
        if function._job is not None:
            executors += [e for e in function._job.executor_names if e not in executors]
        programs.append(_program(label, function, measured, _title(part)))
    for name in ("torch", "python"):
        if name not in executors:
            executors.append(name)
    return {
        "title": _title(compiled),
        "executors": executors,
        "measured": measured,
        "programs": programs,
        "dynamo": _dynamo(dynamo) if dynamo is not None else None,
    }


def _title(compiled) -> str:
    target = getattr(compiled, "_torchdynamo_orig_callable", None) or compiled
    if isinstance(target, ThunderModule):
        target = target._model
    if hasattr(target, "_fn"):
        target = target._fn
    name = (
        type(target).__name__ if isinstance(target, torch.nn.Module) else getattr(target, "__qualname__", "")
    )
    return name or repr(target)[:60]


def _versions() -> dict:
    import platform  # here, not at import thunder_core

    from thunder_core._version import __version__

    device = "CPU: " + (platform.processor() or platform.machine()) + f", {os.cpu_count()} cores"
    if torch.cuda.is_available():
        device = f"GPU: {torch.cuda.get_device_name()}"
    return {
        "thunder_core": __version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device": device,
        "threads": torch.get_num_threads(),
    }


# Measuring ------------------------------------------------------------------------------------


def _eager_callable(compiled):
    target = getattr(compiled, "_torchdynamo_orig_callable", None)
    if target is not None:
        return target
    function = _function(compiled)
    return compiled._model if isinstance(compiled, ThunderModule) else function._fn


def _step(fn, args, kwargs):
    """One call, and the backward of the outputs' means when the result requires grad."""
    out = fn(*args, **kwargs)
    flat, _ = tree_flatten(out)
    differentiable = [
        o for o in flat if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
    ]
    if differentiable:
        sum(o.mean() for o in differentiable).backward()
    return bool(differentiable)


def _leaves_with_grad(compiled, args, kwargs) -> list[torch.Tensor]:
    """The tensors whose ``.grad`` a measured call may change: the module's parameters (of a
    jitted module, of the module a jitted method belongs to) and the arguments that are leaves."""
    target = getattr(compiled, "_torchdynamo_orig_callable", None) or compiled
    if isinstance(target, ThunderModule):
        target = target._model
    elif hasattr(target, "_fn"):  # a jitted function or method
        target = target._fn
    target = getattr(target, "__self__", target)  # jit(model.forward)
    found = list(target.parameters()) if isinstance(target, torch.nn.Module) else []
    flat, _ = tree_flatten((args, kwargs))
    return found + [x for x in flat if isinstance(x, torch.Tensor) and x.is_leaf and x.requires_grad]


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, args, kwargs) -> float:
    _sync()
    start = time.perf_counter()
    _step(fn, args, kwargs)
    _sync()
    return time.perf_counter() - start


def _measure(compiled, args, kwargs, rounds: int) -> dict:
    eager = _eager_callable(compiled)
    parameters = _leaves_with_grad(compiled, args, kwargs)
    saved_grads = [p.grad for p in parameters]
    try:
        trains = _step(compiled, args, kwargs)  # compiles
        _step(eager, args, kwargs)
        times = {"eager": [], "thunder_core": []}
        for _ in range(max(1, rounds)):  # interleaved, so a slow moment of the machine hits both
            times["eager"].append(_timed(eager, args, kwargs))
            times["thunder_core"].append(_timed(compiled, args, kwargs))
        regions, peak = _profile(compiled, args, kwargs)
        _, eager_peak = _profile(eager, args, kwargs)
    finally:
        for p, grad in zip(parameters, saved_grads):
            p.grad = grad
    return {
        "trains": trains,
        "rounds": max(1, rounds),
        "eager_ms": _summary(times["eager"]),
        "compiled_ms": _summary(times["thunder_core"]),
        "regions": regions,
        "peak_bytes": peak,
        "eager_peak_bytes": eager_peak,
        "peak_source": "torch.cuda.max_memory_allocated"
        if torch.cuda.is_available()
        else "torch.profiler memory events (allocations minus frees during the call)",
    }


def _summary(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    import statistics

    return {"median": statistics.median(ms), "min": ms[0], "max": ms[-1]}


def _profile(fn, args, kwargs) -> tuple[dict, int]:
    """Milliseconds per thunder_core range (summed over its calls, with the number of calls) and
    the peak memory of one call."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities):  # builds the programs with ranges (once, on first use)
        _step(fn, args, kwargs)
        _sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with profile(activities=activities, profile_memory=True) as prof:
        _step(fn, args, kwargs)
        _sync()
    regions: dict[str, dict] = {}
    for event in prof.events():
        if event.name.startswith("thunder_core/"):
            entry = regions.setdefault(event.name, {"ms": 0.0, "calls": 0})
            entry["ms"] += _exclusive_us(event) / 1e3
            entry["calls"] += 1
    if torch.cuda.is_available():
        return regions, torch.cuda.max_memory_allocated() - base
    return regions, _peak_from_events(prof.events())


def _duration_us(event) -> float:
    return event.time_range.end - event.time_range.start


def _exclusive_us(event) -> float:
    """The event's time less that of the thunder_core ranges inside it (a region that torch runs
    as a trace of its own, a block's program): each microsecond is counted in one range."""
    inner, pending = 0.0, list(event.cpu_children)
    while pending:
        child = pending.pop()
        if child.name.startswith("thunder_core/"):
            inner += _duration_us(child)
        else:
            pending.extend(child.cpu_children)
    return max(0.0, _duration_us(event) - inner)


def _peak_from_events(events) -> int:
    deltas = sorted(
        (e.time_range.start, e.self_cpu_memory_usage)
        for e in events
        if getattr(e, "self_cpu_memory_usage", 0)
    )
    held = peak = 0
    for _, delta in deltas:
        held += delta
        peak = max(peak, held)
    return peak


# The programs -------------------------------------------------------------------------------


def _program(label: str, function, measured: dict | None, name: str) -> dict:
    entries = list(function._entries)
    last = function.last_compiled()
    return {
        "label": label,
        "name": name,
        "entries": [_entry(i, c) for i, c in enumerate(entries)],
        "notes": list(last.notes) if last is not None else [],
        "stages": _stages(last.traces, last.backward_traces, measured=measured) if last is not None else [],
        "blocks": [_block(b, measured) for b in last.blocks] if last is not None else [],
        "saved": _saved(last) if last is not None else [],
    }


def _entry(index: int, compiled) -> dict:
    guard = compiled.guard
    descriptions = list(getattr(guard, "descriptions", []) or [])
    return {
        "index": index,
        "reason": compiled.reason or "first call",
        "guards": len(descriptions),
        "guard_lines": [f"{what}: {_short(expected)}" for what, expected in descriptions[:300]],
        "sizes": compiled.sizes_note,
        "disk": compiled.disk_note,
    }


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _stages(*groups, measured) -> list[dict]:
    """Each trace of each group (forward, backward), the last one that runs shown operation by operation."""
    stages = []
    for traces in groups:
        claimed = [i for i, t in enumerate(traces) if t.decisions]
        last = claimed[-1] if claimed else None
        stages += [_stage(t, measured, executed=i == last) for i, t in enumerate(traces)]
    return stages


def _block(block, measured) -> dict:
    return {
        "name": block.name,
        "module_class": block.module_class,
        "calls": block.calls,
        "stages": _stages(block.invariant_traces, block.traces, block.backward_traces, measured=measured),
    }


def _stage(trace, measured, executed: bool) -> dict:
    return {
        "function": trace.function_name,
        "provenance": str(trace.provenance) if trace.provenance is not None else "captured",
        "executed": executed,
        "operations": len([b for b in trace.bound_symbols if b.symbol.name != "del"]),
        "lines": _lines(trace, measured) if executed else [],
        "text": "" if executed else trace.python(),
    }


def _lines(trace, measured) -> list[dict]:
    regions = (measured or {}).get("regions", {})
    printer = Printer()
    lines = []
    for bsym in trace.bound_symbols:
        if bsym.symbol.name == "del":
            continue
        executor = running_executor(bsym) or "torch"
        call = printer.call(bsym.replace(impl=None))
        outputs = printer.target(bsym.output)
        text = f"{outputs} = {call}" if outputs else call
        range_name = region_name(trace, bsym)
        time = regions.get(range_name)
        line = {
            "text": text,
            "executor": executor,
            "range": range_name,
            "ms": round(time["ms"], 4) if time else None,
            "source": _source(bsym.source),
            "region": None,  # a fused region: its operations
            "code": "",  # a fused region: the executor's own code, where it gives it
        }
        fused = bsym.subsymbols and bsym.impl is not None and executor not in ("torch", "python")
        if fused:
            inner = Printer()
            line["region"] = [
                {"text": _sub_text(inner, sub), "source": _source(sub.source)} for sub in bsym.subsymbols
            ]
            code = _generated_code(bsym.impl)
            if code:
                line["code"] = code
        lines.append(line)
    return lines


def _sub_text(printer: Printer, bsym) -> str:
    call = printer.call(bsym.replace(impl=None))
    outputs = printer.target(bsym.output)
    return f"{outputs} = {call}" if outputs else call


def _generated_code(impl) -> str:
    """The executor's own code for a region, where its compiled object gives it."""
    for _ in range(4):  # FirstCall / Measured wrappers around the executor's callable
        attributes = getattr(impl, "__dict__", None)
        if attributes is None:
            return ""
        for name in ("source", "source_code"):  # Numba's kernels say ``source``, Inductor's ``source_code``
            if isinstance(attributes.get(name), str):
                return attributes[name]
        impl = attributes.get("fn") or getattr(impl, "compiled", None)  # a region compiled later
    return ""


def _source(location) -> dict | None:
    from urllib.parse import quote  # here, not at import thunder_core

    if location is None:
        return None
    filename = str(location.filename)
    link = "file://" + quote(os.path.abspath(filename)) if os.path.exists(filename) else None
    return {"file": filename, "line": location.lineno, "link": link, "code": location.line.strip()}


def _saved(compiled) -> list[dict]:
    """Each tensor the forward saves for the backward, with the bytes it holds."""
    forward = [t for t in compiled.traces if t.decisions]
    if not compiled.backward_traces or not forward:
        return []
    output = forward[-1].output
    if not isinstance(output, tuple) or len(output) != 2:
        return []
    saved = []
    inputs = {p.name for p in forward[-1].inputs}
    for p in leaves(output[1]):
        if isinstance(p, TensorProxy):
            sized = all(isinstance(s, int) for s in p.shape)
            nbytes = math.prod(p.shape) * p.dtype.itemsize if sized else None
            saved.append(
                {
                    "name": p.name,
                    "type": p.type_string(),
                    "bytes": nbytes,
                    "input": p.name in inputs,  # an input (a weight): held anyway, not extra
                }
            )
    return saved


# The torch.compile front end ----------------------------------------------------------------


def _dynamo(report) -> dict:
    graphs, breaks = [], Counter()
    where: dict[tuple[str, str], list[int]] = defaultdict(list)
    for record in report.graphs:
        partitions = []
        for part in record.partitions:
            runner = (
                "thunder_core"
                if part.owner == "thunder_core"
                else getattr(record.compiled.get(part.name), "runner", "fallback")
            )
            partitions.append(
                {
                    "name": part.name,
                    "owner": part.owner,
                    "runner": runner,
                    "nodes": len(part.nodes),
                    "reasons": [str(r) for r in part.reasons],
                }
            )
        graphs.append(
            {
                "index": record.index,
                "code": record.code,
                "ended_by": record.ended_by[:500],
                "graph_break": record.graph_break,
                "location": record.location,
                "partitions": partitions,
                "notes": list(record.notes),
            }
        )
        if record.graph_break:
            key = (record.ended_by.splitlines()[0][:300] if record.ended_by else "", record.location)
            breaks[key] += 1
            where[key].append(record.index)
    return {
        "graphs": graphs,
        "breaks": [
            {"reason": reason, "location": location, "count": n, "graphs": where[(reason, location)]}
            for (reason, location), n in breaks.most_common()
        ],
    }
