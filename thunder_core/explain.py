"""``thunder_core.explain``: who runs each operation of a jitted function, and why not the others."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from thunder_core.executors.background import BackgroundCompile
from thunder_core.inspection import _function, _last, compile_report
from thunder_core.ir.codegen import Printer


@dataclass
class OperationReport:
    trace: str  # "computation", "forward" or "backward"
    operation: str  # the operation as the trace prints it
    executor: str
    declined: dict[str, str] = field(default_factory=dict)
    note: str = ""


@dataclass
class Explanation:
    """Per operation of the executed traces: the executor that claimed it, and every other one's reason."""

    executors: list[str]
    not_used: dict[str, str]
    operations: list[OperationReport]
    notes: list[str]
    graphs: list[str] = field(default_factory=list)  # torch.compile front end: graphs, breaks, splits

    def for_symbol(self, name: str) -> list[OperationReport]:
        """Reports whose operation calls ``name`` (e.g. ``"torch.add"``)."""
        return [r for r in self.operations if f"{name}(" in r.operation]

    def __str__(self) -> str:
        lines = list(self.graphs)
        lines.append(f"executors, in claim order: {', '.join(self.executors)}")
        for name, why in sorted(self.not_used.items()):
            lines.append(f"  not used: {name}: {why}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        current = None
        for r in self.operations:
            if r.trace != current:
                lines.append(f"\n[{r.trace}]")
                current = r.trace
            lines.append(f"{r.operation}\n    -> {r.executor}" + (f" ({r.note})" if r.note else ""))
            for name, why in r.declined.items():
                lines.append(f"       {name}: {why}")
        return "\n".join(lines)


def _executed(compiled) -> list:
    """The executed (claimed) traces of a compiled entry or block: computation or forward, and backward."""
    return [t for t in compiled.traces if t.decisions][-1:] + [
        t for t in compiled.backward_traces if t.decisions
    ][-1:]


def _measured(trace) -> dict[str, object]:
    """Output name -> the ``Selection`` of the measured claim that computes it."""
    measured = {}
    for bsym in trace.bound_symbols:
        selection = getattr(bsym.impl, "selection", None)
        if selection is not None:
            for sub in bsym.subsymbols or [bsym]:
                measured.update((p.name, selection) for p in sub.flat_outputs())
    return measured


def _background(impl) -> BackgroundCompile | None:
    """The region's compile running (or run) in the background, if it has one."""
    for candidate in (getattr(impl, "waits_for", None), getattr(impl, "__dict__", {}).get("fn")):
        if isinstance(candidate, BackgroundCompile):
            return candidate
    return None


def _compiled_in_background(trace) -> dict[str, BackgroundCompile]:
    """Output name -> the background compile of the region that computes it."""
    found = {}
    for bsym in trace.bound_symbols:
        background = _background(bsym.impl)
        if background is not None:
            for sub in bsym.subsymbols:
                found.update((p.name, background) for p in sub.flat_outputs())
    return found


def _failed_at_run_time(trace) -> dict[str, str]:
    """Output name -> reason, for the operations of regions whose first run failed (torch ran them)."""
    failed = {}
    for bsym in trace.bound_symbols:
        failure = getattr(bsym.impl, "failure", None)
        if failure:
            for sub in bsym.subsymbols:
                failed.update((p.name, failure) for p in sub.flat_outputs())
    return failed


def _graph_lines(report) -> list[str]:
    lines = [f'torch.compile(backend="thunder_core"): {len(report.graphs)} graph(s) from Dynamo']
    for record in report.graphs:
        ending = "graph break" if record.graph_break else "end of graph"
        lines.append(f"graph {record.index} ({record.code}): {ending} at {record.location}")
        lines.append(f"    Dynamo: {record.ended_by[:300]}")
        for part in record.partitions:
            runner = (
                "thunder_core"
                if part.owner == "thunder_core"
                else getattr(record.compiled.get(part.name), "runner", "fallback")
            )
            lines.append(f"  {part.name}: {len(part.nodes)} node(s) -> {runner}")
            for reason in part.reasons:
                lines.append(f"      split: {reason}")
        for note in record.notes:
            lines.append(f"  note: {note}")
    return lines


def _explain_compiled(report) -> Explanation:
    operations, notes, executors, not_used = [], [], ["torch"], {}
    for record, name, part in report.thunder_parts():
        if part._forward.last_compiled() is None:
            continue
        inner = explain(part)
        executors, not_used = inner.executors, inner.not_used
        notes += [f"graph {record.index} {name}: {note}" for note in inner.notes]
        for r in inner.operations:
            operations.append(replace(r, trace=f"graph {record.index} {name} {r.trace}"))
    return Explanation(executors, not_used, operations, notes, _graph_lines(report))


def explain(jfn) -> Explanation:
    """Explain the executors' choices for the most recent call of ``jfn``.

    ``jfn`` is what ``thunder_core.jit`` returned, or what ``torch.compile(...,
    backend="thunder_core")`` returned: then the report starts with every graph Dynamo handed
    over, why it ended (a graph break, with Dynamo's reason and the source line), and how it was
    split between thunder_core and the fallback (which node, and why).
    """
    report = compile_report(jfn)
    if report is not None:
        return _explain_compiled(report)
    function = _function(jfn)
    compiled = _last(jfn)
    job = function._job
    reports = []
    executed = [(t.function_name, t) for t in _executed(compiled)]
    for block in getattr(compiled, "blocks", ()):
        executed += [(f"{block.name} ({block.module_class}, {block.calls} calls) {t.function_name}", t)
                     for t in _executed(block)]  # fmt: skip
    for label, trace in executed:
        printer = Printer()
        failed = _failed_at_run_time(trace)
        measured = _measured(trace)
        backgrounds = _compiled_in_background(trace)
        for decision in trace.decisions:
            operation = printer.call(decision.bsym.replace(impl=None))
            executor, declined, note = decision.executor, dict(decision.declined), decision.note
            outputs = [p.name for p in decision.bsym.flat_outputs()]
            selection = next((measured[n] for n in outputs if n in measured), None) or decision.selection
            failure = getattr(decision.bsym.impl, "failure", None) or next(
                (failed[n] for n in outputs if n in failed), None
            )
            background = next((backgrounds[n] for n in outputs if n in backgrounds), None)
            if background is not None and background.failure:
                failure, selection = background.failure, None
            elif background is not None:
                note = "; ".join(filter(None, (note, background.note())))
            if selection is not None:
                if executor in selection.failed:
                    declined[executor] = selection.failed[executor]
                elif selection.chosen != executor:
                    declined[executor] = f"claimed it, but {selection.chosen} ran faster"
                executor = selection.chosen
                note = "; ".join(filter(None, (note, str(selection))))
            elif failure:
                declined[executor] = failure
                executor = "torch"
            reports.append(OperationReport(label, operation, executor, declined, note))
    executors = job.executor_names if job is not None else ["torch"]
    not_used = dict(job.not_used) if job is not None else {}
    notes = list(compiled.notes)
    for _, trace in executed:
        for bsym in trace.bound_symbols:
            background = _background(bsym.impl)
            failure = getattr(bsym.impl, "failure", None) or (background.failure if background else None)
            if failure:
                notes.append(
                    f"{bsym.symbol.printed_name} ({trace.function_name}): {failure}; torch ran it instead"
                )
    return Explanation(executors, not_used, reports, notes)
