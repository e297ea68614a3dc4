"""The ``after_executors`` pass of ``reduce-overhead`` and the runner that captures and replays.

``partition`` splits the lowered trace into runs of graph-safe operations: every tensor they
read and produce is on one CUDA device (``device="any"`` lifts this for tests on CPU traces), no
output is a Python number or another non-tensor (a value read back to the host, a collective's
handle), and the operation mutates nothing (an in-place update of an input would land in the
graph's static copy). Each run of at least ``min_ops`` operations becomes one call of a
``GraphRunner``; the rest stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from thunder_core.extend import BoundSymbol, Symbol, TensorProxy, Trace, free_inputs, is_impure, leaves

TORCH = "torch"


def _graph_safe(bsym: BoundSymbol, device: str) -> bool:
    # An update in place, also inside a fusion region that writes its input (it carries the effect),
    # would land in the graph's static copy of the input.
    if is_impure(bsym) or any(is_impure(s) for s in bsym.subsymbols) or bsym.symbol.name == "del":
        return False
    outputs = bsym.flat_outputs()
    if not outputs or any(not isinstance(p, TensorProxy) for p in outputs):
        return False
    tensors = [p for p in (*bsym.flat_args(), *outputs) if isinstance(p, TensorProxy)]
    if any(not isinstance(p, TensorProxy) for p in bsym.flat_args()):
        return False
    return device == "any" or all(p.device.type == "cuda" for p in tensors)


@dataclass
class GraphRunner:
    """Calls ``fn`` through CUDA graphs: one captured per input layout, replayed afterwards."""

    fn: object
    warmup: int = 2
    graphs: dict = field(default_factory=dict)
    captures: int = 0
    replays: int = 0

    def __call__(self, *args):
        if not all(a.is_cuda for a in args if isinstance(a, torch.Tensor)):
            return self.fn(*args)  # CPU tensors (tests of the transform): no graph
        key = tuple(
            (a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args
        )
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(args)
            self.captures += 1
        static_inputs, graph, static_outputs = entry
        for static, arg in zip(static_inputs, args):
            if isinstance(arg, torch.Tensor) and static.data_ptr() != arg.data_ptr():
                static.copy_(arg)
        graph.replay()
        self.replays += 1
        return tuple(o.clone() for o in static_outputs)

    def _capture(self, args):
        static_inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                self.fn(*static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_outputs = self.fn(*static_inputs)
        return static_inputs, graph, tuple(static_outputs)


def _region_call(index: int, bsyms: list[BoundSymbol], later_reads: set[str], options: dict) -> BoundSymbol:
    inputs = free_inputs(bsyms)
    outputs, out_seen = [], set()
    for b in bsyms:
        for p in b.flat_outputs():
            if p.name in later_reads and p.name not in out_seen:
                out_seen.add(p.name)
                outputs.append(p)
    name = f"cudagraph_{index}"
    region = Trace(inputs=inputs, bound_symbols=bsyms, output=tuple(outputs), function_name=name)
    runner = GraphRunner(region.python_callable(), warmup=options.get("warmup", 2))
    symbol = Symbol(name=name, impl=runner, printed_name=name)
    return BoundSymbol(symbol, tuple(inputs), {}, tuple(outputs), subsymbols=list(bsyms), executor=TORCH)


def partition(trace: Trace, options: dict) -> Trace:
    device = options.get("device", "cuda")
    min_ops = options.get("min_ops", 2)
    bsyms = trace.bound_symbols
    reads_after: list[set[str]] = [set() for _ in range(len(bsyms) + 1)]
    reads_after[len(bsyms)] = {p.name for p in leaves(trace.output) if hasattr(p, "name")}
    for i in range(len(bsyms) - 1, -1, -1):
        reads_after[i] = reads_after[i + 1] | {p.name for p in bsyms[i].flat_args()}
    out, run, count = [], [], 0

    def close(end: int) -> None:
        nonlocal run, count
        if len(run) >= min_ops:
            count += 1
            out.append(_region_call(count, run, reads_after[end], options))
        else:
            out.extend(run)
        run = []

    for i, bsym in enumerate(bsyms):
        if _graph_safe(bsym, device):
            run.append(bsym)
        else:
            close(i)
            out.append(bsym)
    close(len(bsyms))
    return trace.with_bound_symbols(out) if count else trace


def use_cuda_graphs(trace: Trace, options: dict) -> Trace:
    """The pass: graph-safe runs of the lowered trace as CUDA-graph calls."""
    return partition(trace, options)


def runners(trace: Trace) -> list[GraphRunner]:
    """The graph runners of a lowered trace (to read ``captures`` and ``replays``)."""
    return [b.symbol.impl for b in trace.bound_symbols if isinstance(b.symbol.impl, GraphRunner)]
