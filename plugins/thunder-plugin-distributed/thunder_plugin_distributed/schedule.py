"""Where the collectives of a lowered trace run: early starts, late waits, buckets.

A pass at the ``after_executors`` stage, so it sees the trace in its final order (fusion
regions formed). It

1. splits each ``fsdp_all_gather`` into ``fsdp_all_gather_start`` / ``fsdp_all_gather_wait``,
   and each ``tp_all_reduce`` (tensor parallelism) into ``tp_all_reduce_start`` / ``_wait``;
2. merges the gradient all-reduces of ``ddp`` into buckets of up to ``bucket_size_mb``
   (0: one per gradient; the first bucket at most 1 MiB, as DistributedDataParallel's), in the
   order the backward produces the gradients;
3. places every start right after the last of its inputs is computed and every wait right
   before the first use of its results, so communication overlaps the compute between them;
4. bounds what is in flight where it costs memory: a parameter gather is issued when the
   previous one is waited (one gather ahead of the compute), and a gradient reduce-scatter is
   waited before the one two after it starts (its padded full-size gradient freed early).
"""

from __future__ import annotations

from dataclasses import dataclass

from thunder_core.extend import BoundSymbol, ObjectProxy, Trace
from thunder_plugin_distributed.collectives import (
    GATHERS,
    STARTS,
    WAITS,
    ddp_all_reduce_start,
    ddp_all_reduce_wait,
    fsdp_all_gather_start,
    fsdp_all_gather_wait,
)
from thunder_plugin_distributed.tp_collectives import tp_all_reduce_start, tp_all_reduce_wait

TORCH = "torch"
REDUCE_SCATTERS_IN_FLIGHT = 2
FIRST_BUCKET_BYTES = 1 << 20


@dataclass
class _Pair:
    start: BoundSymbol
    wait: BoundSymbol
    order: int  # position in the trace before scheduling, to keep ties in program order
    start_gap: int = 0
    wait_gap: int = 0

    @property
    def kind(self) -> str:
        return self.start.symbol.name


def _names(trace: Trace) -> set[str]:
    names = {p.name for p in trace.inputs if hasattr(p, "name")}
    for b in trace.bound_symbols:
        names.update(p.name for p in b.flat_outputs())
    return names


def _unique(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _split_gathers(bsyms: list[BoundSymbol], taken: set[str]) -> list[BoundSymbol]:
    out = []
    for b in bsyms:
        if b.symbol.name == "tp_all_reduce":
            x, group = b.args
            handle = ObjectProxy(_unique(f"{b.output.name}_summing", taken))
            out.append(BoundSymbol(tp_all_reduce_start, (x, group), {}, handle, executor=TORCH))
            wait_args = (handle, tuple(x.shape), x.dtype, x.device)
            out.append(BoundSymbol(tp_all_reduce_wait, wait_args, {}, b.output, executor=TORCH))
            continue
        if b.symbol.name not in GATHERS:
            out.append(b)
            continue
        shard, rows, group = b.args
        handle = ObjectProxy(_unique(f"{b.output.name}_gathering", taken))
        out.append(BoundSymbol(fsdp_all_gather_start, (shard, group), {}, handle, executor=TORCH))
        wait_args = (handle, rows, tuple(shard.shape), shard.dtype, shard.device, b.output.requires_grad)
        out.append(BoundSymbol(fsdp_all_gather_wait, wait_args, {}, b.output, executor=TORCH))
    return out


def _pairs(bsyms: list[BoundSymbol]) -> tuple[list[_Pair], list[BoundSymbol]]:
    starts, pairs, compute = {}, [], []
    for i, b in enumerate(bsyms):
        name = b.symbol.name
        if name in STARTS:
            starts[b.output.name] = (i, b)
        elif name in WAITS:
            order, start = starts.pop(b.args[0].name)
            pairs.append(_Pair(start, b, order))
        else:
            compute.append(b)
    if starts:  # a start whose wait is not in this trace: a bug of the pass that made it, never ignored
        raise ValueError(f"collective(s) started but never waited in this trace: {sorted(starts)}")
    return pairs, compute


def _bucketed(pairs: list[_Pair], cap_bytes: int) -> list[_Pair]:
    """DDP's all-reduces merged into buckets, in the order their gradients become ready."""

    def single(p: _Pair) -> bool:  # not a bucket already (the pass ran before on this trace)
        return p.kind == "ddp_all_reduce_start" and len(p.start.args[0]) == 1

    ddp = sorted((p for p in pairs if single(p)), key=lambda p: (p.start_gap, p.order))
    others = [p for p in pairs if not single(p)]
    buckets: list[list[_Pair]] = []
    size = 0
    for pair in ddp:
        grad = pair.start.args[0][0]
        nbytes = grad.numel() * grad.element_size()
        # The first bucket is small (as DistributedDataParallel's): communication starts early.
        limit = min(cap_bytes, FIRST_BUCKET_BYTES) if len(buckets) == 1 else cap_bytes
        if buckets and cap_bytes > 0:
            first = buckets[-1][0].start.args[0][0]
            same = (first.dtype, first.device, buckets[-1][0].start.args[1]) == (
                grad.dtype,
                grad.device,
                pair.start.args[1],
            )
            if same and size + nbytes <= limit:
                buckets[-1].append(pair)
                size += nbytes
                continue
        buckets.append([pair])
        size = nbytes
    merged = []
    for bucket in buckets:
        if len(bucket) == 1:
            merged.append(bucket[0])
            continue
        head = bucket[0]
        grads = tuple(p.start.args[0][0] for p in bucket)
        outputs = tuple(p.wait.output[0] for p in bucket)
        start = BoundSymbol(
            ddp_all_reduce_start, (grads, head.start.args[1]), {}, head.start.output, executor=TORCH
        )
        shapes = tuple(tuple(g.shape) for g in grads)
        wait = BoundSymbol(
            ddp_all_reduce_wait,
            (head.start.output, shapes, grads[0].dtype, grads[0].device),
            {},
            outputs,
            executor=TORCH,
        )
        merged.append(
            _Pair(
                start,
                wait,
                head.order,
                start_gap=max(p.start_gap for p in bucket),
                wait_gap=min(p.wait_gap for p in bucket),
            )
        )
    return [*others, *merged]


def _place(pairs: list[_Pair], compute: list[BoundSymbol]) -> None:
    produced_at = {}
    for i, b in enumerate(compute):
        for p in b.flat_outputs():
            produced_at[p.name] = i
    first_use = {}
    for i, b in enumerate(compute):
        for p in b.flat_args():
            first_use.setdefault(p.name, i)
    end = len(compute)
    for pair in pairs:
        inputs = [p for p in pair.start.flat_args()]
        pair.start_gap = max((produced_at[p.name] + 1 for p in inputs if p.name in produced_at), default=0)
        results = [p for p in pair.wait.flat_outputs()]
        pair.wait_gap = max(pair.start_gap, min((first_use.get(p.name, end) for p in results), default=end))


def _bound_in_flight(pairs: list[_Pair]) -> None:
    gathers = sorted(
        (p for p in pairs if p.kind == "fsdp_all_gather_start"), key=lambda p: (p.wait_gap, p.order)
    )
    for previous, pair in zip(gathers, gathers[1:]):
        pair.start_gap = min(max(pair.start_gap, previous.wait_gap), pair.wait_gap)
    scatters = sorted(
        (p for p in pairs if p.kind == "fsdp_reduce_scatter_start"), key=lambda p: (p.start_gap, p.order)
    )
    for pair, later in zip(scatters, scatters[REDUCE_SCATTERS_IN_FLIGHT:]):
        pair.wait_gap = max(pair.start_gap, min(pair.wait_gap, later.start_gap))


def _after_their_inputs(pairs: list[_Pair]) -> None:
    """A collective that takes another one's result (tensor parallelism's sum of a gradient that
    fsdp reduce-scattered) starts no earlier than that result is waited for, and that wait comes
    no later than the taker's own wait (which its first use bounds)."""
    producers = {p.name: pair for pair in pairs for p in pair.wait.flat_outputs()}
    changed = True
    while changed:
        changed = False
        for pair in pairs:
            for arg in pair.start.flat_args():
                producer = producers.get(arg.name)
                if producer is None or producer is pair:
                    continue
                if producer.wait_gap > pair.wait_gap:
                    producer.wait_gap, changed = pair.wait_gap, True
                if pair.start_gap < producer.wait_gap:
                    pair.start_gap, changed = producer.wait_gap, True
    for pair in pairs:
        if not pair.start_gap <= pair.wait_gap:
            raise ValueError(
                f"{pair.kind}: no place between its inputs and its first use (a bug of this pass)"
            )


def _in_dependency_order(items: list[BoundSymbol]) -> list[BoundSymbol]:
    """``items`` (the collectives placed in one gap, in the preferred order), each after those
    of them whose results it takes."""
    made_here = {p.name for b in items for p in b.flat_outputs()}
    defined: set[str] = set()
    out, remaining = [], list(items)
    while remaining:
        for i, b in enumerate(remaining):
            if {a.name for a in b.flat_args()} & made_here <= defined:
                out.append(remaining.pop(i))
                defined.update(p.name for p in b.flat_outputs())
                break
        else:
            raise ValueError(f"collectives that wait on each other: {[b.symbol.name for b in remaining]}")
    return out


def _emit(pairs: list[_Pair], compute: list[BoundSymbol]) -> list[BoundSymbol]:
    at_gap: dict[int, list] = {}
    for pair in pairs:
        at_gap.setdefault(pair.start_gap, []).append((1, pair.order, pair.start))
        waits_first = 0 if pair.wait_gap > pair.start_gap else 2
        at_gap.setdefault(pair.wait_gap, []).append((waits_first, pair.order, pair.wait))
    out = []
    for gap in range(len(compute) + 1):
        placed = [b for *_, b in sorted(at_gap.get(gap, ()), key=lambda item: item[:2])]
        out += _in_dependency_order(placed)
        if gap < len(compute):
            out.append(compute[gap])
    return out


def schedule_collectives(trace: Trace, options: dict) -> Trace:
    """The pass (see the module docstring); a trace without collectives is returned as it is."""
    names = {b.symbol.name for b in trace.bound_symbols}
    if not names & (set(GATHERS) | STARTS | {"tp_all_reduce"}):
        return trace
    bsyms = _split_gathers(trace.bound_symbols, _names(trace))
    pairs, compute = _pairs(bsyms)
    _place(pairs, compute)
    pairs = _bucketed(pairs, int(options.get("bucket_size_mb", 0) * 2**20))
    _place(pairs, compute)
    _bound_in_flight(pairs)
    _after_their_inputs(pairs)
    return trace.with_bound_symbols(_emit(pairs, compute))


def collectives_in(trace: Trace) -> list[str]:
    """The names of the collective symbols of ``trace``, in order (for tests and docs)."""
    return [b.symbol.name for b in trace.bound_symbols if b.symbol.name in STARTS | WAITS | set(GATHERS)]
