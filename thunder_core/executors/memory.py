"""How many bytes a claim holds at once, and how many it may hold without raising a trace's peak.

Measured selection uses these so that a candidate that is a little faster never costs the job
its memory: a torch fallback runs a region op by op and materializes intermediates a fused
kernel keeps in registers, which at the peak of a training step (the end of the forward, or the
start of the backward) adds directly to the step's peak.

Sizes are counted for tensors with known shapes. Views (``VIEW_OPS``) allocate nothing and keep
their base alive. A trace's inputs count from its start to their last use when the trace frees
them (``Trace.boxed_inputs``: a backward and the tensors the forward saved); otherwise the
caller holds them throughout, the same at every point, and they are left out.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import BoundSymbol
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves
from thunder_core.ops.shapes import VIEW_OPS


def tensor_bytes(proxy: TensorProxy) -> int:
    return proxy.size_hint_bytes  # symbolic sizes at their captured values: a heuristic, never guarded


def held_bytes(
    bsyms: list[BoundSymbol], outputs, materializes: Callable[[BoundSymbol], bool] | None = None
) -> int | None:
    """The most bytes ``bsyms`` hold at once, each value freed after its last use. By default
    every value is counted: the operations run one by one (the torch executor, or a job claiming
    them op by op). For a fused region, ``materializes(bsym)`` says which operations' inputs and
    outputs the compiled code writes to memory; the region's ``outputs`` always count. None when
    a size is not known."""
    try:
        keep = {p.name for p in outputs}
        counted = None
        if materializes is not None:
            counted = set(keep)
            for b in bsyms:
                if materializes(b):
                    counted.update(p.name for p in (*b.flat_args(), *b.flat_outputs()))
        last = {p.name: i for i, b in enumerate(bsyms) for p in b.flat_args()}
        live: dict[str, int] = {}
        most = 0
        for i, b in enumerate(bsyms):
            if b.symbol.name not in VIEW_OPS:
                live.update(
                    (p.name, tensor_bytes(p))
                    for p in b.flat_outputs()
                    if isinstance(p, TensorProxy) and (counted is None or p.name in counted)
                )
            most = max(most, sum(live.values()))
            for name in [n for n in live if n not in keep and last.get(n, -1) <= i]:
                del live[name]
        return most
    except (TypeError, AttributeError):  # symbolic or unknown sizes
        return None


def region_bytes(executor, bsyms: list[BoundSymbol], outputs) -> int | None:
    """What a region compiled by fusion ``executor`` holds at once: its outputs, and the values
    it writes to memory around library calls (``FusionExecutor.materializes``)."""
    return held_bytes(bsyms, outputs, executor.materializes)


def fused_bytes(outputs) -> int | None:
    """The bytes of ``outputs``: what an operation holds, or a region that keeps all of its
    intermediates in registers and caches."""
    try:
        return sum(tensor_bytes(p) for p in outputs if isinstance(p, TensorProxy))
    except (TypeError, AttributeError):
        return None


def headroom(trace: Trace, held: list[int | None]) -> list[int | None]:
    """For each bound symbol of ``trace``, the most bytes it may hold at once without raising the
    trace's peak: the peak of live values (each bound symbol holding ``held[i]`` bytes while it
    runs) minus what else is alive then. None everywhere when a size is not known."""
    count = len(trace.bound_symbols)
    if any(h is None for h in held):
        return [None] * count
    owner: dict[str, str | None] = {}  # a value -> the value owning its memory (None: an input's)
    size: dict[str, int] = {}
    born: dict[str, int] = {}
    last: dict[str, int] = {}
    try:
        if trace.boxed_inputs:  # freed after their last use: alive from the start until then
            for p in trace.inputs:
                if isinstance(p, TensorProxy) and p.name not in owner:
                    owner[p.name], size[p.name], born[p.name], last[p.name] = p.name, tensor_bytes(p), -1, -1
        for i, bsym in enumerate(trace.bound_symbols):
            args = [p for p in bsym.flat_args() if isinstance(p, TensorProxy)]
            for p in args:
                if owner.get(p.name) is not None:
                    last[owner[p.name]] = i
            view_of = owner.get(args[0].name) if bsym.symbol.name in VIEW_OPS and args else ""
            for p in bsym.flat_outputs():
                if not isinstance(p, TensorProxy):
                    continue
                if view_of != "":  # a view: the memory of its base (None: of a trace input)
                    owner[p.name] = view_of
                else:
                    owner[p.name], size[p.name], born[p.name], last[p.name] = p.name, tensor_bytes(p), i, i
        for p in leaves(trace.output):  # returned: alive to the end
            if isinstance(p, TensorProxy) and owner.get(p.name) is not None:
                last[owner[p.name]] = count
    except (TypeError, AttributeError):  # symbolic or unknown sizes
        return [None] * count
    change = [0] * (count + 2)  # alive while bound symbol i runs: made before i, read at i or later
    for name, bytes_ in size.items():
        if last[name] > born[name] and last[name] >= 0:
            change[born[name] + 1] += bytes_
            change[last[name] + 1] -= bytes_
    ambient, alive = [], 0
    for i in range(count):
        alive += change[i]
        ambient.append(alive)
    peak = max((a + h for a, h in zip(ambient, held)), default=0)
    return [peak - a for a in ambient]
