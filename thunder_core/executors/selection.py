"""Choosing by measurement which executor runs a claimed operation or region.

Claim order decides who *claims* an operation and where fused regions begin and end. Whether
that claim is also the fastest way to run it depends on the shapes and the machine, so each
claim (a fused region, or an operator executor's implementation) is timed against its
alternatives on its first call's real inputs, and the fastest is kept:

- every other executor of the job that accepts all of the claim's operations (a fusion
  executor compiles the same region; an operator executor takes a single operation);
- the job's other executors, claiming the same operations in their own order (so a region a
  whole-program executor claimed is timed against what the rest of the job would run);
- the torch executor running the operations as they are.

An alternative that would hold more bytes at once than the claim's place in the trace leaves
below the trace's peak is not measured (``executors/memory.py``): a few microseconds never buy
a higher peak.

Candidates are compiled when the claim is first called, run once to warm up (a candidate that
raises drops out, with the warning ``report_failure`` gives), then timed in interleaved rounds
within ``ROUND_BUDGET_S`` per claim, each run on a copy of the inputs that is out of the CPU's
caches (``executors/caches.py``); each candidate's fastest run counts. The claim as made stays
unless another candidate is faster by more than ``SWITCH_MARGIN``: a gap of a few percent is within
what a few rounds can tell apart, and switching for it can cost more than it saves (another
executor's library imported and its kernels loaded in every new process). The choice is kept with
the compiled program (the generated code calls the winner directly from then on) and shown by
``explain``. A claim identical to one measured earlier in the process (the same operations on
inputs of the same metadata, with the same candidates: the layers of a model compiled as one
program, or the next program of a decoding loop) takes the earlier winner without being
measured again; when that winner is torch, the claim's operations go into the program as torch
calls when it is compiled (``measure_claims``), with no region callable around them.

Claims with effects (in-place updates, random draws, hooks) are not measured: running them
more than once would repeat the effect; claim order decides them, as with ``select="priority"``.
Nor are claims whose outputs (or views of them) are updated in place: the update must reach
what the claimed executor returned (a view of a KV cache, say), and another candidate could
return a copy where it returns a view. A claim whose output is only read by an update (the new
keys written into a KV cache) is measured. Nor are claims with symbolic sizes: the sizes they
run at vary, and compiling an alternative after the trace's size guards were taken could assume
something about the sizes that no guard checks. A region compiled in the background
(``thunder_core.executors.background``) runs its torch operations until its compile is done, and
is then timed against them on the call after. In a program compiled in the background, the
other claims run as made while the worker still has compiles to do, and are measured at their
first call after it is idle: compiling an alternative (an Inductor region) on the calling thread
would wait for the worker's compile in progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from thunder_core.executors import decisions, failures
from thunder_core.executors.background import BackgroundCompile, compiles_pending, in_background
from thunder_core.executors.base import FusionExecutor, OperatorExecutor, has_symbolic_sizes
from thunder_core.executors.caches import ColdInputs
from thunder_core.executors.failures import FirstCall, _strict, report_failure
from thunder_core.executors.fusion import compile_now, operations, to_torch, torch_fallback
from thunder_core.executors.memory import fused_bytes, headroom, held_bytes, region_bytes
from thunder_core.executors.regions import Region, RegionNotSupported
from thunder_core.ir.proxies import PROXY_TYPES, TensorProxy
from thunder_core.ir.symbols import PYTHON, BoundSymbol, is_impure
from thunder_core.ir.trace import Trace
from thunder_core.ops.shapes import VIEW_OPS
from thunder_core.transforms.delete_last_used import delete_last_used
from thunder_core.transforms.updates import updated_in_place

SELECTIONS = ("measure", "priority")
ROUND_BUDGET_S = 0.25  # time spent timing the candidates of one claim, after their warm-up runs
MAX_ROUNDS = 7
SWITCH_MARGIN = 0.1  # another candidate replaces the claim as made only when this much faster
MAX_DECISIONS = 4096  # measured decisions kept per process (``claim_key``)
TORCH = "torch"


@dataclass
class Candidate:
    """One way to run a claim: a label for ``explain``, a factory compiling it, and the bytes it
    holds at once while it runs (its outputs, plus the intermediates it materializes), when known."""

    name: str
    make: Callable[[], Callable]
    held_bytes: int | None = None


@dataclass
class Selection:
    """What the measurement found: the fastest run's seconds per candidate, failures, and the winner."""

    chosen: str
    seconds: dict[str, float]
    failed: dict[str, str]
    earlier: bool = False  # taken from an identical claim measured before in this process
    stored: bool = False  # taken from the on-disk cache: measured by an earlier process

    def __str__(self) -> str:
        timings = ", ".join(f"{name} {s * 1e6:.1f} us" for name, s in self.seconds.items())
        failed = "".join(f"; {name} failed: {why}" for name, why in self.failed.items())
        where = " (measured on an identical claim earlier)" if self.earlier else ""
        if self.stored:
            where = " (measured by an earlier process on this machine, from the disk cache)"
        fastest = min(self.seconds, key=self.seconds.get) if self.seconds else self.chosen
        margin = (
            f" (the claimant; {fastest} was faster by less than {SWITCH_MARGIN:.0%})"
            if fastest != self.chosen
            else ""
        )
        return f"measured {timings}{where}: {self.chosen} kept{margin}{failed}"


# Decisions by claim key (``claim_key``): a claim identical to one measured before in this
# process (the same operations on inputs of the same metadata, with the same candidates; the
# layers of a model that is not compiled as repeated blocks) takes the same winner unmeasured.
_DECISIONS: dict[tuple, Selection] = {}


def _canonical(value, names: dict[str, str]):
    if isinstance(value, TensorProxy):
        if value.name not in names:
            names[value.name] = f"v{len(names)}"
            return (names[value.name], tuple(value.shape), tuple(value.stride()), value.dtype, value.device)
        return names[value.name]
    if isinstance(value, PROXY_TYPES):
        return names.setdefault(value.name, f"v{len(names)}")
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(x, names) for x in value)
    if isinstance(value, dict):
        return tuple((k, _canonical(v, names)) for k, v in value.items())
    return repr(value)


def claim_key(bsym: BoundSymbol, owner, executors: list, candidates: list[Candidate]) -> tuple:
    """What makes two claims the same choice: the claiming executor and the job's executors (the
    objects, not their names), the candidates measured, and the operations up to names with
    their inputs' shapes, strides, dtypes and devices."""
    names: dict[str, str] = {}
    inputs = _canonical(bsym.args, names)
    fused = isinstance(owner, FusionExecutor)  # a region's own name differs from region to region
    ops = tuple(
        (
            s.symbol.printed_name,
            _canonical(s.args, names),
            _canonical(s.kwargs, names),
            _canonical(s.output, names),
        )
        for s in (bsym.subsymbols if fused else [bsym])
    )
    outputs = _canonical(bsym.output, names)
    return owner, tuple(executors), tuple(c.name for c in candidates), inputs, ops, outputs


class Measured:
    """Runs the fastest of ``candidates``, chosen by timing them on the first call's inputs.

    The first candidate is the claim as made; the generated code is rebound to the winner
    after the first call (``attach_to_namespace``, as ``FirstCall`` does). A claim whose
    ``key`` was measured before in this process takes that winner without measuring again.
    """

    def __init__(
        self,
        candidates: list[Candidate],
        operations: str,
        key: tuple | None = None,
        waits_for: BackgroundCompile | None = None,
        bound_symbols=None,
    ):
        self.candidates = candidates
        self._bound_symbols = bound_symbols  # the operations, for a reproducer of a failure
        self.waits_for = waits_for  # the claim, compiling in the background: measured once it is done
        self._operations = operations
        self._key = key
        self._strict = _strict.get()
        self._options = failures._options.get()
        self._background = in_background()  # alternatives are compiled once the worker is idle
        self._store = decisions.current_store()  # choices of earlier processes, on disk
        self._slots: list[tuple[dict, str]] = []
        self.selection: Selection | None = None
        self.failure: str | None = None  # set when the claimed executor failed and torch runs it
        self.fn: Callable | None = None
        self._as_made: Callable | None = None
        self.__name__ = "measured_call"

    def attach_to_namespace(self, namespace: dict, name: str) -> None:
        self._slots.append((namespace, name))

    def _compile_and_warm_up(self, args, kwargs) -> tuple[dict[str, Callable], dict[str, str], object]:
        ready, failed, result = {}, {}, None
        for candidate in self.candidates:
            try:
                fn = candidate.make()
            except RegionNotSupported as reason:  # an alternative that cannot take it: no warning
                failed[candidate.name] = f"could not compile it: {reason}"
                continue
            except Exception as error:
                fn = _raising(error)
            try:
                out = fn(*args, **kwargs)
            except Exception as error:  # a candidate that fails drops out, as a failed first run would
                token, options_token = _strict.set(self._strict), failures._options.set(self._options)
                try:
                    failed[candidate.name] = report_failure(
                        candidate.name, "on its first run", self._operations, error, self._bound_symbols
                    )
                finally:
                    failures._options.reset(options_token)
                    _strict.reset(token)
                continue
            ready[candidate.name] = fn
            if result is None:
                result = out
        return ready, failed, result

    def _decided_before(self, args, kwargs):
        """The winner of an identical claim measured earlier, compiled and run; None if there is
        none or it fails here (then every candidate is measured)."""
        earlier = _known_selection(self._key, self._store, self.candidates[0].name)
        candidate = next((c for c in self.candidates if earlier and c.name == earlier.chosen), None)
        if candidate is None:
            return None
        try:
            fn = candidate.make()
            result = fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - measured afresh, which reports the failure properly
            return None
        return earlier, fn, result

    def _claim_as_made(self) -> Callable:
        """The claim, run without measuring while the program's compiles are in the background:
        compiling its alternatives now would wait for them (they hold ``COMPILE_LOCK``)."""
        if self._as_made is None:
            self._as_made = self.candidates[0].make()
        return self._as_made

    def _bind(self, fn) -> None:
        self.fn = fn
        for namespace, name in self._slots:
            if namespace.get(name) is self:
                namespace[name] = fn

    def __call__(self, *args, **kwargs):
        if self.fn is not None:
            return self.fn(*args, **kwargs)
        if self.waits_for is not None:
            if not self.waits_for.done():
                return self.waits_for(*args, **kwargs)  # its torch operations, until the compile is done
            if self.waits_for.failure:  # no compiled region to time: its torch operations stay
                self.failure = self.waits_for.failure
                self._bind(self.waits_for)
                return self.fn(*args, **kwargs)
        decided = self._decided_before(args, kwargs)
        if decided is not None:
            self.selection, fn, result = decided
            self._bind(fn)
            return result
        if self._background and self.waits_for is None and compiles_pending():
            try:
                return self._claim_as_made()(*args, **kwargs)
            except Exception:  # noqa: BLE001 - measured now, which reports it and runs another candidate
                pass
        ready, failed, result = self._compile_and_warm_up(args, kwargs)
        if not ready:  # pragma: no cover - torch is always a candidate; it raising is the user's error
            raise RuntimeError(f"every executor failed to run {self._operations}: {failed}")
        seconds = _time_interleaved(ready, ColdInputs(args, kwargs, runs=MAX_ROUNDS * len(ready)))
        claimed = self.candidates[0].name
        chosen = _fastest(seconds, claimed)
        self.selection = Selection(chosen, seconds, failed)
        if claimed in failed:
            self.failure = failed[claimed]
        elif self._key is not None:
            if len(_DECISIONS) >= MAX_DECISIONS:
                _DECISIONS.clear()  # keys hold executors: never grow without bound
            _DECISIONS[self._key] = self.selection
            if self._store is not None:
                decisions.save(self._store, self._key, chosen, seconds)
        self._bind(ready[chosen])
        return result


def _known_selection(key: tuple | None, store, claimed: str) -> Selection | None:
    """The winner of an identical claim measured before: in this process, or by an earlier one
    (``store``, on disk; chosen again from its timings, as the rule may have changed since)."""
    if key is None:
        return None
    earlier = _DECISIONS.get(key)
    if earlier is not None:
        return replace(earlier, earlier=True)
    stored = decisions.load(store, key) if store is not None else None
    if stored is None:
        return None
    chosen = _fastest(stored[1], claimed) if stored[1] else stored[0]
    return Selection(chosen, stored[1], {}, stored=True)


def _fastest(seconds: dict[str, float], claimed: str) -> str:
    """The fastest candidate, or the claim as made unless that one beats it by ``SWITCH_MARGIN``."""
    fastest = min(seconds, key=seconds.get)
    if claimed in seconds and seconds[fastest] > (1 - SWITCH_MARGIN) * seconds[claimed]:
        return claimed
    return fastest


def _raising(error: Exception) -> Callable:
    def run(*args, **kwargs):
        raise error

    return run


def _time_interleaved(ready: dict[str, Callable], inputs: ColdInputs) -> dict[str, float]:
    """Seconds of each candidate's fastest run, over rounds that run each once (A B C A B C ...),
    each run on the next of ``inputs``' copies (out of the CPU's caches).

    The fastest run, not the median: what slows a run down here (the first passes over freshly
    made copies, the machine's other work) is not the candidate's cost, and it can last for
    half of the few rounds a claim gets.
    """
    times: dict[str, list[float]] = {name: [] for name in ready}
    spent, rounds = 0.0, 0
    while rounds < MAX_ROUNDS and (rounds < 1 or spent < ROUND_BUDGET_S):
        for name, fn in ready.items():
            args, kwargs = inputs.next()
            start = time.perf_counter()
            fn(*args, **kwargs)
            elapsed = time.perf_counter() - start
            times[name].append(elapsed)
            spent += elapsed
        rounds += 1
    return {name: min(t) for name, t in times.items()}


def _accepts_all(executor, bsyms: list[BoundSymbol]) -> bool:
    return all(executor.check(b) is True for b in bsyms)


def _region_of(bsym: BoundSymbol) -> Region:
    return Region(list(bsym.subsymbols), list(bsym.args), list(bsym.output))


def _torch_candidate(bsym: BoundSymbol, fused: bool) -> Candidate | None:
    if fused:
        held = held_bytes(list(bsym.subsymbols), bsym.flat_outputs())
        return Candidate(TORCH, lambda: torch_fallback(_region_of(bsym)), held)
    if bsym.symbol.impl is None:
        return None
    return Candidate(TORCH, lambda: bsym.symbol.impl)  # called as the claimed implementation is


def _rest_of_job(
    bsym: BoundSymbol, others: list, claim: Callable, labels: dict[int, str] | None = None
) -> Candidate | None:
    """The claim's operations claimed by the job's other executors (``claim``), as one callable.

    ``labels`` names some of ``others`` in ``explain`` (by ``id``; default: the executor's name).
    """
    fusion_or_operator = [e for e in others if e.name != TORCH]
    ops = list(bsym.subsymbols)
    if not any(e.check(b) is True for e in fusion_or_operator for b in ops):
        return None  # the others would leave every operation to torch: the torch candidate
    inputs = list(bsym.args)

    def make() -> Callable:
        trace = Trace(inputs, ops, bsym.output, function_name="rest_of_job")
        return delete_last_used(claim(trace, others)).python_callable()

    name = "+".join((labels or {}).get(id(e), e.name) for e in others)
    return Candidate(name, make, held_bytes(ops, bsym.flat_outputs()))


def _candidates(
    bsym: BoundSymbol, owner, executors: list, claim: Callable, room: int | None
) -> list[Candidate]:
    """The claim as made, then its alternatives that hold at most ``room`` bytes at once, so that
    no alternative raises the trace's peak memory (when sizes elsewhere in the trace are not
    known: at most twice what the claim holds)."""
    fused = isinstance(owner, FusionExecutor)
    claimed = bsym.impl.fn if isinstance(bsym.impl, FirstCall) else bsym.impl
    outputs = bsym.flat_outputs()
    ops = list(bsym.subsymbols) if fused else [bsym.replace(impl=None, executor=None)]
    candidates = [
        Candidate(owner.name, lambda: claimed, region_bytes(owner, ops, outputs) if fused else None)
    ]
    region = _region_of(bsym) if fused else None
    for other in executors:
        if other is owner or other.name == TORCH:
            continue
        if isinstance(other, FusionExecutor) and fused and _accepts_all(other, ops):
            candidates.append(
                Candidate(
                    other.name,
                    lambda other=other: compile_now(other, region),
                    region_bytes(other, ops, outputs),
                )
            )
        elif isinstance(other, OperatorExecutor) and not fused and _accepts_all(other, ops):
            candidates.append(Candidate(other.name, lambda other=other: other.claimed(ops[0]).impl))
    if fused:
        others = [e for e in executors if e is not owner and e.name not in {c.name for c in candidates}]
        labels = {}
        finer = owner.finer_variant()
        if finer is not None and finer[1] is not owner and finer[1].finer_variant() is None:
            label, variant = finer  # one level: the variant's own regions are not refined again
            ahead = executors[: executors.index(owner)]
            others.insert(sum(e in ahead for e in others), variant)  # in the owner's place
            labels[id(variant)] = label
        rest = _rest_of_job(bsym, others, claim, labels)
        if rest is not None and rest.name != TORCH:
            candidates.append(rest)
    torch_candidate = _torch_candidate(bsym, fused)
    candidates += [torch_candidate] if torch_candidate is not None else []
    if room is None and candidates[0].held_bytes is not None:  # sizes unknown elsewhere in the trace
        room = 2 * max(candidates[0].held_bytes, 1)
    fits = [c for c in candidates[1:] if room is None or c.held_bytes is None or c.held_bytes <= room]
    return [candidates[0], *fits]


def _claimed_bytes(bsym: BoundSymbol, owner) -> int | None:
    """What a bound symbol holds at once as claimed: a fused region per its executor, another
    operation its outputs (a view nothing)."""
    if isinstance(owner, FusionExecutor) and bsym.subsymbols:
        return region_bytes(owner, list(bsym.subsymbols), bsym.flat_outputs())
    return 0 if bsym.symbol.name in VIEW_OPS else fused_bytes(bsym.flat_outputs())


def _updated_later(trace: Trace) -> Callable[[BoundSymbol], bool]:
    """A test: is an output of this claim, or a view of it, updated in place (anywhere in the trace)?"""
    updated = updated_in_place(trace.bound_symbols)
    return lambda bsym: any(p.name in updated for p in bsym.flat_outputs())


def _compiling_in_background(bsym: BoundSymbol) -> BackgroundCompile | None:
    impl = bsym.impl.fn if isinstance(bsym.impl, FirstCall) else bsym.impl
    return impl if isinstance(impl, BackgroundCompile) else None


def measure_claims(trace: Trace, executors: list, claim: Callable[[Trace, list], Trace]) -> Trace:
    """Wrap each claim that has alternatives in a ``Measured`` that times them on its first call.

    A claim whose identical claim torch won before (in this process, or by an earlier one on
    disk) is replaced by its operations run by torch; the returned trace's ``selected_before``
    maps their outputs to that selection, for ``explain``. ``claim(trace, executors)`` claims a
    trace with some of the job's executors (for the rest-of-the-job candidate).
    """
    by_name = {e.name: e for e in executors}
    store = decisions.current_store()
    inlined: dict[str, Selection] = {}  # output name -> the earlier selection that gave its claim to torch
    updated_later = _updated_later(trace)
    rooms = headroom(trace, [_claimed_bytes(b, by_name.get(b.executor)) for b in trace.bound_symbols])
    changed = False
    bsyms = []
    for bsym, room in zip(trace.bound_symbols, rooms):
        owner = by_name.get(bsym.executor)
        if (
            owner is None
            or owner.name == TORCH
            or bsym.symbol.has_tag(PYTHON)
            or bsym.impl is None
            or any(is_impure(b) for b in [bsym, *bsym.subsymbols])
            or updated_later(bsym)
            or has_symbolic_sizes(bsym)  # sizes vary; and a later compile could add a size guard unseen
        ):
            bsyms.append(bsym)
            continue
        background = _compiling_in_background(bsym)
        if background is not None:  # timed against its torch operations once it is compiled
            torch_candidate = _torch_candidate(bsym, True)
            candidates = [Candidate(owner.name, lambda b=background: b), torch_candidate]
            key = claim_key(bsym, owner, executors, candidates)
            ops = list(bsym.subsymbols)
            bsyms.append(
                bsym.replace(
                    impl=Measured(candidates, operations(ops), key, waits_for=background, bound_symbols=ops)
                )
            )
            changed = True
            continue
        candidates = _candidates(bsym, owner, executors, claim, room)
        if len(candidates) < 2:
            bsyms.append(bsym)
            continue
        ops = list(bsym.subsymbols) or [bsym]
        key = claim_key(bsym, owner, executors, candidates)
        known = _known_selection(key, store, candidates[0].name)
        if known is not None and known.chosen == TORCH and any(c.name == TORCH for c in candidates):
            # torch won this claim before: its operations go into the program as they are, called
            # directly instead of through a region's callable.
            fused = isinstance(owner, FusionExecutor)  # an operator's claim stays whole: torch's own op
            bsyms += [to_torch(b) for b in bsym.subsymbols] if fused else [to_torch(bsym)]
            inlined.update((p.name, known) for b in ops for p in b.flat_outputs())
        else:
            bsyms.append(bsym.replace(impl=Measured(candidates, operations(ops), key, bound_symbols=ops)))
        changed = True
    if not changed:
        return trace
    result = trace.with_bound_symbols(bsyms, trace.provenance)
    for attribute in ("decisions", "given_back"):
        if hasattr(trace, attribute):
            setattr(result, attribute, getattr(trace, attribute))
    result.selected_before = inlined
    return result
