"""Assigning bound symbols to executors.

Pre: a trace of torch-level bound symbols (with decompositions as subsymbols) and the job's
executors in priority order (torch last). Post: an execution trace in which every bound
symbol names the executor that runs it, plus one ``Decision`` per operation saying who
claimed it and why each other executor did not.

For each bound symbol the executors are asked in order; the first that accepts claims it.
If none does and some executor would take part of its decomposition, the bound symbol is
replaced by its subsymbols, each claimed the same way; the torch executor takes what is left.
Random ops are never decomposed: their decomposition draws other numbers than the op (dropout
as ``uniform`` and a comparison, where eager draws with ``bernoulli_``), and eager's stream is kept.
Views of tensors that are updated in place are left to the torch executor (a view costs
nothing, and a fused region that returned one could not be measured against alternatives).
Fusion executors' claims are then grouped into regions by their ``fusion_pass``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from thunder_core.errors import ThunderCoreError
from thunder_core.executors import python_executor, torch_executor
from thunder_core.executors.base import (
    FIXED_SIZES_ONLY,
    FusionExecutor,
    OperatorExecutor,
    Rejection,
    has_symbolic_sizes,
)
from thunder_core.executors.failures import FirstCall, report_failure
from thunder_core.executors.fusion import operations
from thunder_core.executors.selection import measure_claims
from thunder_core.ir.symbols import PYTHON, RANDOM, WHOLE, BoundSymbol, is_impure
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ops.shapes import VIEW_OPS
from thunder_core.transforms.updates import updated_in_place


@dataclass
class Decision:
    """Who runs one operation, and why each other executor in the job declined."""

    bsym: BoundSymbol
    executor: str
    declined: dict[str, str] = field(default_factory=dict)
    note: str = ""
    selection: object | None = None  # the earlier measurement that gave its claim back to torch


def _check(executor, bsym) -> bool | Rejection:
    if not executor.takes_symbolic_sizes and has_symbolic_sizes(bsym):  # also where check() is overridden
        return Rejection(FIXED_SIZES_ONLY)
    return executor.check(bsym)


def _claim(executor, bsym: BoundSymbol) -> BoundSymbol:
    if isinstance(executor, OperatorExecutor):
        claimed = executor.claimed(bsym)
        if bsym.symbol.impl is None:
            return claimed
        guarded = FirstCall(
            claimed.impl,
            lambda: bsym.symbol.impl,
            executor.name,
            operations([bsym]),
            impure=is_impure(bsym),
            bound_symbols=[bsym],
        )
        return claimed.replace(impl=guarded)
    if isinstance(executor, FusionExecutor):
        return bsym.replace(executor=executor.name, impl=None)  # fused later by its fusion_pass
    return (
        torch_executor.claim(bsym)
        if executor.name == torch_executor.NAME
        else bsym.replace(executor=executor.name)
    )


def _someone_takes_part(bsyms, executors) -> bool:
    for b in bsyms:
        if any(_check(e, b) is True for e in executors):
            return True
        if _someone_takes_part(b.subsymbols, executors):
            return True
    return False


_VIEW_OF_UPDATED = (
    "a view of a tensor that is updated in place: the torch executor takes it, so that the update "
    "reaches it and the region before it can be measured"
)


@dataclass
class _Decomposed:
    """A bound symbol run as its decomposition because some executor took part of it."""

    bsym: BoundSymbol
    decision: Decision
    parts: list[Decision]  # the decisions made for its parts (of every depth)


def _outputs(bsym: BoundSymbol) -> tuple[str, ...]:
    return tuple(p.name for p in bsym.flat_outputs())


def _first_producers(bsyms: list[BoundSymbol]) -> dict[str, int]:
    position: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        for name in _outputs(b):
            position.setdefault(name, i)
    return position


def _whole_again(
    record: _Decomposed,
    bsyms: list[BoundSymbol],
    position: dict[str, int],
    inputs: set[str],
    outputs: set[str],
):
    """Where ``record``'s parts run, as ``(start, end)`` of ``bsyms``, when the bound symbol can run
    whole there instead; else None. Each direct part must be there, in order and next to the
    others, as itself (an inner decomposition put back whole counts), run by torch, updating
    nothing in place; what the parts compute besides the bound symbol's outputs must be read by
    nothing else; and its arguments must be computed before the first part."""
    parts = record.bsym.subsymbols
    start = position.get(_outputs(parts[0])[0]) if parts and _outputs(parts[0]) else None
    if start is None or start + len(parts) > len(bsyms):
        return None
    run = bsyms[start : start + len(parts)]
    for part, b in zip(parts, run):
        if (
            b.symbol.name != part.symbol.name
            or _outputs(b) != _outputs(part)
            or b.executor != torch_executor.NAME
        ):
            return None
        if is_impure(b) or set(_outputs(b)) & {p.name for p in b.flat_args()}:
            return None
    inside = {n for b in run for n in _outputs(b)} - set(_outputs(record.bsym))
    if any(p.name in inside for b in bsyms[start + len(parts) :] for p in b.flat_args()) or inside & outputs:
        return None
    defined = inputs | {n for b in bsyms[:start] for n in _outputs(b)}
    if any(p.name not in defined for p in record.bsym.flat_args()):
        return None
    return start, start + len(parts)


def _recompose(trace: Trace, decomposed: list[_Decomposed], decisions: list[Decision]) -> Trace:
    """Put back whole each decomposed bound symbol whose parts all ended with torch (what
    was taken went back, as a shape op outside a region does): one call of the original
    operation (``F.linear``) instead of its parts (a permute and a matmul), as eager runs it.
    Inner decompositions come first in ``decomposed``, so an outer one can follow them."""
    from thunder_core.ir.proxies import PROXY_TYPES
    from thunder_core.ir.tree import leaves

    bsyms = list(trace.bound_symbols)
    inputs = {p.name for p in leaves(trace.inputs) if isinstance(p, PROXY_TYPES)}
    outputs = {x.name for x in leaves(trace.output) if isinstance(x, PROXY_TYPES)}
    position = _first_producers(bsyms)
    changed = False
    for record in decomposed:
        found = _whole_again(record, bsyms, position, inputs, outputs)
        if found is None:
            continue
        start, end = found
        bsyms[start:end] = [torch_executor.claim(record.bsym)]
        position = _first_producers(bsyms)
        record.decision.executor = torch_executor.NAME
        record.decision.note = "its parts all went back to torch: run whole"
        record.decision.bsym = bsyms[start]
        parts = {id(d) for d in record.parts}
        decisions[:] = [d for d in decisions if id(d) not in parts]
        changed = True
    return trace.with_bound_symbols(bsyms) if changed else trace


def _assign(
    bsym: BoundSymbol,
    executors,
    fallback,
    out: list,
    decisions: list,
    updated=frozenset(),
    decomposed: list | None = None,
) -> None:
    declined = {}
    if bsym.symbol.name in VIEW_OPS and any(p.name in updated for p in bsym.flat_outputs()):
        declined = {e.name: _VIEW_OF_UPDATED for e in executors if isinstance(e, FusionExecutor)}
        executors = [e for e in executors if not isinstance(e, FusionExecutor)]
    for executor in executors:
        verdict = _check(executor, bsym)
        if verdict is True:
            out.append(_claim(executor, bsym))
            decisions.append(Decision(out[-1], executor.name, declined))
            return
        declined[executor.name] = str(verdict)
    whole = bsym.symbol.has_tag(WHOLE) or bsym.symbol.has_tag(RANDOM)
    if bsym.subsymbols and not whole and _someone_takes_part(bsym.subsymbols, executors):
        decision = Decision(bsym, "(decomposed)", declined, "run as its decomposition")
        decisions.append(decision)
        first = len(decisions)
        for sub in bsym.subsymbols:
            _assign(sub.replace(source=bsym.source), executors, fallback, out, decisions, updated, decomposed)
        if decomposed is not None and fallback is not None and bsym.symbol.impl is not None:
            decomposed.append(_Decomposed(bsym, decision, decisions[first:]))
        return
    if fallback is None:
        raise ThunderCoreError(
            f"no executor takes {bsym.symbol.printed_name} and the torch executor is disabled: "
            + "; ".join(f"{k}: {v}" for k, v in declined.items())
        )
    out.append(torch_executor.claim(bsym))
    decisions.append(Decision(out[-1], fallback.name, declined))


def assign_executors(
    trace: Trace, executors=None, options: dict | None = None, select: str = "priority"
) -> Trace:
    """Claim every bound symbol; the decisions are kept on the returned trace (``trace.decisions``).

    ``select="measure"`` then times each claim against its alternatives on its first call
    (``thunder_core.executors.selection``); ``"priority"`` keeps every claim as made.
    """
    start = time.perf_counter()
    executors = list(executors) if executors is not None else [torch_executor.executor]
    fallback = next((e for e in executors if e.name == torch_executor.NAME), None)
    others = [e for e in executors if e is not fallback]
    claimed: list[BoundSymbol] = []
    decisions: list[Decision] = []
    updated = updated_in_place(trace.bound_symbols)
    decomposed: list[_Decomposed] = []
    for bsym in trace.bound_symbols:
        if bsym.symbol.has_tag(PYTHON):
            claimed.append(bsym.replace(executor=python_executor.NAME))
            continue
        _assign(bsym, others, fallback, claimed, decisions, updated, decomposed)
    result = trace.with_bound_symbols(claimed, None)
    for executor in others:
        if isinstance(executor, FusionExecutor):
            result.given_back = {}
            if not any(b.executor == executor.name for b in result.bound_symbols):
                continue
            try:
                result = executor.fusion_pass(result, (options or {}).get(executor.name, {}))
            except Exception as error:  # the whole pass failed: torch runs what this executor claimed
                mine = [b for b in result.bound_symbols if b.executor == executor.name]
                reason = report_failure(executor.name, "in its fusion pass", operations(mine), error)
                result = result.with_bound_symbols(
                    [
                        torch_executor.claim(b) if b.executor == executor.name else b
                        for b in result.bound_symbols
                    ]
                )
                result.given_back = {
                    p.name: reason
                    for d in decisions
                    if d.executor == executor.name
                    for p in d.bsym.flat_outputs()
                }
            given_back = result.given_back
            for decision in decisions:
                names = [p.name for p in decision.bsym.flat_outputs()]
                if decision.executor == executor.name and any(n in given_back for n in names):
                    decision.declined[executor.name] = given_back[next(n for n in names if n in given_back)]
                    decision.executor = torch_executor.NAME
    if decomposed:
        given_back = getattr(result, "given_back", None)
        result = _recompose(result, decomposed, decisions)
        if given_back is not None:
            result.given_back = given_back
    if select == "measure":

        def claim(part: Trace, some_executors: list) -> Trace:
            return assign_executors(part, some_executors, options, select)

        result = measure_claims(result, executors, claim)
        selected = getattr(result, "selected_before", {})
        if selected and decomposed:  # parts of decomposed operations given to torch: run them whole
            given_back = getattr(result, "given_back", None)
            result = _recompose(result, decomposed, decisions)
            if given_back is not None:
                result.given_back = given_back
        for decision in decisions if selected else ():
            decision.selection = next(
                (selected[p.name] for p in decision.bsym.flat_outputs() if p.name in selected), None
            )
    result.provenance = Provenance("assign_executors", time.perf_counter() - start)
    result.decisions = decisions
    return result
