"""The ``thunder_core`` backend of ``torch.compile``: Dynamo's FX graphs through thunder_core.

Dynamo captures the Python program into FX graphs, breaking the graph wherever it cannot trace
(``.item()`` in a branch, ``print``, unsupported libraries) and guarding every Python value it
read. Each graph it hands over is split (``split.py``) into the parts thunder_core captures — each
compiled by ``thunder_core.jit`` with the job's executors and plugins, and connected to PyTorch
autograd like ``jit`` — and the rest, compiled by Inductor (or run eagerly). Everything compiled
for one ``torch.compile``-d callable is kept in a ``CompileReport`` for ``explain`` and
``last_traces``.
"""

from __future__ import annotations

import copy
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.passes.split_module
from torch import fx

from thunder_core.dynamo.split import Partition, partition
from thunder_core.errors import CaptureError, DataDependentError
from thunder_core.jit.module import ThunderModule
from thunder_core.ops.registry import draws_random_numbers
from thunder_core.plugins.config import resolve
from thunder_core.plugins.errors import ConfigError
from thunder_core.plugins.job import build_job

# Dynamo by default does not guard on module hooks added after compilation (a hook registered
# later is silently ignored); thunder_core's contract is never a stale result, so once this
# backend is loaded, hook changes recompile — for every torch.compile in the process.
if hasattr(torch._dynamo.config, "skip_nnmodule_hook_guards"):
    torch._dynamo.config.skip_nnmodule_hook_guards = False

OPTIONS = {
    "executors": "ordered executor names (as in thunder_core.jit)",
    "plugins": "transform plugins to enable",
    "options": "per executor/plugin options, {name: {option: value}}",
    "disable": "executors or plugins never to use",
    "select": "'measure' (default) or 'priority', as in thunder_core.jit",
    "fallback": "'inductor' (default) or 'eager': what runs the parts thunder_core does not capture",
    "recompile_limit": "compilations per thunder_core part before it runs eagerly (default 8)",
}


@dataclass
class GraphRecord:
    """One FX graph Dynamo handed over: where it ended, and how it was split."""

    index: int
    code: str  # the function (or Dynamo resume function) the graph came from
    ended_by: str  # Dynamo's reason: a graph break, or the end of the function
    graph_break: bool
    location: str  # file:line of the user code where the graph ended
    partitions: list[Partition]
    compiled: dict[str, Any] = field(default_factory=dict)  # partition name -> ThunderModule or fallback
    notes: list[str] = field(default_factory=list)


class CompileReport:
    """Every graph, graph break and split of one ``torch.compile``-d callable."""

    def __init__(self):
        self.graphs: list[GraphRecord] = []
        self.lock = threading.Lock()

    def thunder_parts(self) -> list[tuple[GraphRecord, str, ThunderModule]]:
        return [
            (record, name, part)
            for record in self.graphs
            for name, part in record.compiled.items()
            if isinstance(part, ThunderModule)
        ]


_REPORTS: dict[int, tuple[Any, CompileReport]] = {}


def _owner_of_compile():
    """The callable ``torch.compile`` wrapped, found on the stack (Dynamo calls backends from it)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "compile_wrapper" and frame.f_code.co_filename.endswith("eval_frame.py"):
            return frame.f_locals.get("fn")
        frame = frame.f_back
    return None


def _key(fn):
    self = getattr(fn, "__self__", None)
    return id(self) if self is not None else id(fn)


def _referent(fn):
    return getattr(fn, "__self__", None) or fn


def report_for(compiled) -> CompileReport | None:
    """The report of a ``torch.compile``-d function or module, if thunder_core compiled any of it."""
    original = getattr(compiled, "_torchdynamo_orig_callable", None)
    if original is None:
        return None
    entry = _REPORTS.get(_key(original))
    if entry is None:
        return None
    ref, report = entry
    alive = ref() if isinstance(ref, weakref.ref) else ref
    return report if alive is _referent(original) else None


def _report_for_owner(owner) -> CompileReport:
    key = _key(owner)
    entry = _REPORTS.get(key)
    referent = _referent(owner)
    if entry is not None:
        ref, report = entry
        if (ref() if isinstance(ref, weakref.ref) else ref) is referent:
            return report
    report = CompileReport()
    try:
        ref = weakref.ref(referent, lambda _, key=key: _REPORTS.pop(key, None))
    except TypeError:
        ref = referent
    _REPORTS[key] = (ref, report)
    return report


def _dynamo_context():
    """(code name, reason the graph ended, was it a graph break, user location), from Dynamo."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        reason = tx.output.compile_subgraph_reason
    except Exception:  # a torch without these internals: report less, compile the same
        return "?", "(unknown)", False, "?"
    stack = list(getattr(reason, "user_stack", None) or [])
    location = f"{stack[-1].filename}:{stack[-1].lineno}: {(stack[-1].line or '').strip()}" if stack else "?"
    text = " ".join(str(getattr(reason, "reason", "")).split())
    return tx.f_code.co_name, text, bool(getattr(reason, "graph_break", False)), location


class _Fallback:
    """A part thunder_core does not capture: compiled by Inductor, else run eagerly.

    Inductor compiles it while Dynamo hands the graph over, on Dynamo's example inputs (fake
    tensors whose sizes may be symbolic), as ``backend="inductor"`` would: the code it makes
    serves every size Dynamo's guards let through. Compiling it on the first call's real
    inputs instead would fix their sizes, and a later call with other sizes would get sizes
    and numbers computed for the first.
    """

    def __init__(self, gm: fx.GraphModule, how: str, record: GraphRecord, name: str):
        self.gm, self.how, self.record, self.name = gm, how, record, name
        self.compiled, self.runner = gm, "eager"
        if how == "inductor" and _draws_random_numbers(gm):
            # Inductor draws with its own generator (other numbers, another stream position).
            self.runner = "eager (it draws random numbers; Inductor's draws differ from eager's)"
        elif how == "inductor":
            examples = _example_inputs(gm)
            if examples is None:
                self.runner = "eager (Dynamo gave no example inputs for this part)"
                return
            try:
                from torch._inductor.compile_fx import compile_fx

                # Inductor may rewrite the graph it is given: give it a copy, keep ours for eager.
                graph_copy = fx.GraphModule(gm, copy.deepcopy(gm.graph))
                self.compiled, self.runner = compile_fx(graph_copy, examples), "inductor"
            except Exception as error:  # Inductor cannot compile it: eager is always right
                self.runner = f"eager (Inductor failed: {type(error).__name__}: {str(error)[:200]})"

    def __call__(self, *args):
        return self.compiled(*args)


def _example_inputs(gm: fx.GraphModule) -> list | None:
    """Dynamo's example values (fake tensors, SymInts) of ``gm``'s inputs, or None if one lacks them."""
    examples = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value", node.meta.get("val"))
        if value is None:
            return None
        examples.append(value)
    return examples


def _draws_random_numbers(gm: fx.GraphModule) -> bool:
    return any(
        node.op in ("call_function", "call_method") and draws_random_numbers(node.target)
        for node in gm.graph.nodes
    )


class _ThunderPart:
    """Runs a part with thunder_core; if capturing it fails (a value Dynamo left as a tensor read as
    a Python number, say), that part runs eagerly from then on and the report says why."""

    def __init__(self, part: ThunderModule, gm: fx.GraphModule, record: GraphRecord, name: str):
        self.part, self.gm, self.record, self.name = part, gm, record, name
        self.run = part

    def __call__(self, *args):
        if self.run is self.gm:
            return self.gm(*args)
        try:
            return self.run(*args)
        except (CaptureError, DataDependentError) as error:
            first = str(error).splitlines()[0][:240]
            self.record.notes.append(
                f"{self.name}: thunder_core could not capture it ({type(error).__name__}: {first}); it runs eagerly"
            )
            self.run = self.gm
            return self.gm(*args)


class ThunderCompiler:
    """A Dynamo backend: ``torch.compile(model, backend=ThunderCompiler(executors=[...]))``.

    ``backend="thunder_core"`` (registered by entry point) makes one from
    ``torch.compile(..., options={...})``; the options are ``OPTIONS``, with the same names as
    ``thunder_core.jit``'s, and the environment and config file apply as for ``jit``.
    """

    def __init__(self, **options):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            known = "; ".join(f"{k}: {v}" for k, v in OPTIONS.items())
            raise ConfigError(
                f"unknown torch.compile option(s) {unknown} for backend 'thunder_core'; known: {known}"
            )
        self.fallback = options.get("fallback", "inductor")
        if self.fallback not in ("inductor", "eager"):
            raise ConfigError(
                f"backend 'thunder_core': fallback must be 'inductor' or 'eager', got {self.fallback!r}"
            )
        self.recompile_limit = options.get("recompile_limit", 8)
        self.job = build_job(
            resolve(
                executors=options.get("executors"),
                plugins=options.get("plugins"),
                options=options.get("options"),
                disable=options.get("disable"),
                select=options.get("select"),
            )
        )
        if self.job.module_transforms:
            names = sorted({name.split(".")[0] for _, _, name in self.job.module_transforms})
            raise ConfigError(
                f"backend 'thunder_core': the plugin(s) {names} change the module itself (its parameters), "
                "which Dynamo hands over as separate graphs; use thunder_core.jit(model, plugins=...) instead, "
                "or PyTorch's own wrappers around the model (DistributedDataParallel, fully_shard) with this backend"
            )

    def __call__(self, gm: fx.GraphModule, example_inputs, **kwargs):
        owner = _owner_of_compile()
        report = _report_for_owner(owner) if owner is not None else CompileReport()
        code, ended_by, graph_break, location = _dynamo_context()
        assignment, partitions = partition(gm)
        with report.lock:
            record = GraphRecord(len(report.graphs), code, ended_by, graph_break, location, partitions)
            report.graphs.append(record)
        if any(isinstance(x, torch.SymInt) or _symbolic(x) for x in example_inputs):
            record.notes.append(
                "dynamic shapes: Dynamo passed symbolic sizes; thunder_core specializes each part on the "
                "concrete sizes of each call (a new size recompiles that part)"
            )
        if len(partitions) == 1 and partitions[0].owner == "thunder_core":
            part = self._thunder(gm)
            record.compiled[partitions[0].name] = part
            return _ThunderPart(part, gm, record, partitions[0].name)
        split = torch.fx.passes.split_module.split_module(
            gm, None, lambda node: assignment[node], keep_original_order=True
        )  # in graph order: a part that mutates an input runs before the parts after it
        for index, part in enumerate(partitions):
            name = f"submod_{index}"
            submodule = getattr(split, name)
            if part.owner == "thunder_core":
                compiled = self._thunder(submodule)
                runner = _ThunderPart(compiled, submodule, record, name)
            else:
                compiled = runner = _Fallback(submodule, self.fallback, record, name)
            record.compiled[name] = compiled
            setattr(split, name, _AsModule(runner))
        return split

    def _thunder(self, gm: fx.GraphModule) -> ThunderModule:
        # Dynamo guards the Python state; the FX graph itself holds none, so no guards of our own.
        return ThunderModule(gm, recompile_limit=self.recompile_limit, job=self.job, cache="same input")


class _AsModule(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _symbolic(x) -> bool:
    if not isinstance(x, torch.Tensor):
        return False
    return any(isinstance(s, torch.SymInt) for s in x.shape)


def backend(gm: fx.GraphModule, example_inputs, options: dict | None = None, **unused):
    """The ``torch_dynamo_backends`` entry point: ``torch.compile(fn, backend="thunder_core")``."""
    if unused:
        warnings.warn(
            f"backend 'thunder_core' ignores {sorted(unused)}; pass options={{...}} instead", stacklevel=2
        )
    return ThunderCompiler(**(options or {}))(gm, example_inputs)
