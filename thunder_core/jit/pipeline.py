"""The compilation pipeline: capture, then each transform, then code generation.

Inference (no gradient needed): capture -> dce -> [after_capture passes] -> grouped attention
-> dce -> assign_executors -> attention masks -> [after_executors passes] -> delete_last_used.
Training: capture -> dce -> [after_capture] -> split into forward and backward -> [after_autodiff]
-> rematerialize -> [after_split] -> for each of the two: the same lowering (grouped attention
changes only calls without autograd); the pair runs inside one ``torch.autograd.Function``.

A module's repeated blocks (``thunder_core.jit.blocks``): when capture recorded block calls and
no plugin pass or ambient autocast needs the whole program, each distinct block goes through
autodiff, rematerialization and lowering once, and the program around the block calls goes
through the pipeline above with each call as one operation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from thunder_core import progress
from thunder_core.autodiff.joint import NotDifferentiable, requires_autodiff, split_forward_backward
from thunder_core.capture import capture
from thunder_core.capture.blocks import block_input_names, has_blocks
from thunder_core.capture.without_dynamo import python_meta_kernels_without_dynamo
from thunder_core.executors.attention_masks import share_mask_conversions
from thunder_core.executors.claiming import assign_executors
from thunder_core.executors.failures import strictness
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.trace import Provenance, Trace, TrainingTraces
from thunder_core.jit.autograd import TrainingProgram
from thunder_core.jit.blocks import share_blocks, without_blocks
from thunder_core.jit.cpu_memory import keep_freed_memory
from thunder_core.transforms.autocast import ambient_autocast, autocast_disabled
from thunder_core.transforms.dce import dce
from thunder_core.transforms.delete_last_used import delete_last_used
from thunder_core.transforms.grouped_attention import use_grouped_attention
from thunder_core.transforms.rematerialize import rematerialize


@dataclass
class Compiled:
    """One cache entry: the callable that runs, and the traces that led to it."""

    callable: object
    traces: list[Trace]
    backward_traces: list[Trace] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    guard: object = None  # thunder_core.jit.guards.Guard, or None when nothing is guarded
    reason: str = ""  # why this entry was compiled (what changed since the previous one)
    blocks: list = field(default_factory=list)  # thunder_core.jit.blocks.BlockProgram, one per distinct block
    # For re-validating the entry against a module tree with replaced submodules (thunder_core.jit.rebind):
    guard_tokens: list = field(default_factory=list)  # what each check of the tree walk pins down
    guard_tree_checks: int = 0
    captured_guard: object = None  # () -> the checks added while capturing, as a guard of their own
    size_guard: object = None  # thunder_core.capture.symbolic.SizeGuard of a trace with symbolic sizes
    key: tuple = ()  # the cache key of the call it was compiled for
    symbolic_dims: dict = field(default_factory=dict)  # {tensor index among the inputs: symbolic dims}
    symbolic_ints: frozenset = frozenset()  # positions among the inputs of the ints it takes symbolic
    symbolic_strides: frozenset = frozenset()  # tensor indexes whose strides alone are symbolic
    symbolic: bool = False  # any of the three: calls of other sizes, strides or ints pass its size guard
    sizes_note: str = ""  # which sizes are symbolic, or why none are
    epilogue: object = (
        None  # thunder_core.capture.objects.Epilogue: what to do to argument objects after a call
    )
    captured: Trace | None = None  # the trace capture made (what the on-disk cache stores)
    lifted: int = 0  # how many real tensors capture found outside the inputs (globals, closures)
    disk_note: str = ""  # the on-disk cache: whether the captured trace came from it, or why not
    # What the fast paths to it built (thunder_core.jit.last_entry): generated flatteners by key
    # (under None for an entry with symbolic sizes: one serves every size; False where none can
    # be made), and under "tensors" the metadata check of its all-tensor calls of any size.
    fast_paths: dict = field(default_factory=dict)


def _torch_only(job):
    if job is None:
        return None
    from dataclasses import replace

    torch_executors = [e for e in job.executors if e.name == "torch"]
    not_used = dict(job.not_used)
    for e in job.executors:
        if e.name != "torch":
            not_used[e.name] = "PyTorch autograd records this program (in-place ops), so only torch runs it"
    return replace(job, executors=torch_executors, not_used=not_used)


def _run_passes(trace: Trace, job, stage: str) -> list[Trace]:
    traces = []
    for fn, options, name in job.passes.get(stage, []) if job is not None else []:
        start = time.perf_counter()
        trace = fn(trace, options)
        trace.provenance = Provenance(f"{name} ({stage})", time.perf_counter() - start)
        traces.append(trace)
    return traces


def _run_split_passes(forward: Trace, backward: Trace, job, block_inputs=frozenset()) -> list[TrainingTraces]:
    results = []
    for fn, options, name in job.passes.get("after_split", []) if job is not None else []:
        start = time.perf_counter()
        pair = fn(TrainingTraces(forward, backward, block_inputs), options)
        forward, backward = pair.forward, pair.backward
        seconds = time.perf_counter() - start
        forward.provenance = backward.provenance = Provenance(f"{name} (after_split)", seconds)
        results.append(pair)
    return results


def _lower(trace: Trace, job) -> list[Trace]:
    executors = job.executors if job is not None else None
    options = job.executor_options if job is not None else None
    strict = bool(job is not None and job.config is not None and job.config.strict)
    select = job.config.select if job is not None and job.config is not None else "priority"
    grouped = use_grouped_attention(trace)
    traces = [dce(grouped)] if grouped is trace else [grouped, dce(grouped)]
    progress.stage("assigning executors and compiling regions")
    with strictness(strict, options):
        claimed = assign_executors(traces[-1], executors, options, select)
    traces.append(claimed)
    masks = share_mask_conversions(claimed)
    if masks is not claimed:
        traces.append(masks)
    traces += _run_passes(traces[-1], job, "after_executors")
    traces.append(delete_last_used(traces[-1]))
    traces[-1].decisions = claimed.decisions
    return traces


def _names(proxies) -> list[str]:
    return [getattr(p, "name", None) for p in proxies]


def _with_grad_enabled(program):
    """Run a training program with grad mode on: a call under ``no_grad`` whose function turns
    grad mode on inside (``torch.enable_grad()``) returns outputs that require grad, as in eager."""

    def run(*leaves):
        with torch.enable_grad():
            return program(*leaves)

    return run


def _with_autocast_off(program, device_types):
    """Run a program captured inside ``torch.autocast`` with autocast off for ``device_types``:
    it holds autocast's casts, and one of its operations that ran in a block with autocast off
    (a float32 matmul) would be cast again."""

    devices = tuple(device_types)
    enabled, switch = torch.is_autocast_enabled, torch.set_autocast_enabled

    def run(*leaves):
        before = [enabled(d) for d in devices]
        for d in devices:  # a plain switch: torch.autocast's context manager costs microseconds
            switch(d, False)
        try:
            return program(*leaves)
        finally:
            for d, on in zip(devices, before):
                switch(d, on)

    return run


def _with_lifted(program, lifted: list):
    """``program`` called with the captured real tensors appended to the call's inputs."""
    if not lifted:
        return program
    lifted = tuple(lifted)

    def run(*leaves):
        return program(*leaves, *lifted)

    return run


def compile_function(
    fn,
    args,
    kwargs,
    *,
    positional_names,
    extra_inputs=(),
    extra_binder=None,
    job=None,
    guard_builder=None,
    block_modules=(),
    capture_blocks_once: bool = False,
    symbolic_sizes=None,
    restored: Trace | None = None,
) -> Compiled:
    """Capture ``fn`` on these arguments, transform and lower the trace, and compile it.

    Calls of ``block_modules`` (a model's repeated layers) that do the same thing share one
    transformed and compiled block (``thunder_core.jit.blocks``); with ``capture_blocks_once``,
    a call that would do what an earlier one did is captured without running its Python
    (``thunder_core.capture.block_reuse``).

    Inside ``torch.autocast``, capture records the casts autocast makes (around the call, or
    in a block inside the function) as operations of the trace, so every executor sees the
    dtypes that really flow; the program is compiled and run with autocast off.

    With ``symbolic_sizes`` (``thunder_core.capture.symbolic.SymbolicSizes``) the dimensions it
    names are symbolic, and the result's ``size_guard`` says which later inputs it holds for.

    ``restored`` is a captured trace of this call from the on-disk cache
    (``thunder_core.jit.persistent``): it is used instead of capturing.
    """
    ambient = ambient_autocast()
    with python_meta_kernels_without_dynamo():
        captured, lifted = (
            (restored, [])
            if restored is not None
            else capture(  # under the caller's autocast: the casts it makes are recorded
                fn,
                args,
                kwargs,
                positional_names=positional_names,
                extra_inputs=extra_inputs,
                extra_binder=extra_binder,
                guard_builder=guard_builder,
                block_modules=block_modules,
                capture_blocks_once=capture_blocks_once,
                symbolic_sizes=symbolic_sizes,
            )
        )
    with autocast_disabled(ambient), python_meta_kernels_without_dynamo():
        if guard_builder is not None:
            guard_builder.lifted_tensors(lifted)
        flat = without_blocks(captured)
        progress.stage("transforming")
        compiled = None
        if has_blocks(captured.bound_symbols) and not _has_passes(job):
            compiled = _compile_sharing_blocks(captured, flat, lifted, job)
        if compiled is None:
            compiled = _compile(flat, lifted, job, block_inputs=block_input_names(captured.bound_symbols))
    if ambient:
        compiled.callable = _with_autocast_off(compiled.callable, ambient)
    compiled.epilogue = captured.epilogue
    compiled.captured, compiled.lifted = captured, len(lifted)
    if symbolic_sizes is not None:
        compiled.size_guard = symbolic_sizes.guard()  # after every pass: their size guards included
    if _keeps_cpu_memory(job) and any(
        isinstance(p, TensorProxy) and p.device.type == "cpu" for p in captured.inputs
    ):
        compiled.notes.append(keep_freed_memory())
    return compiled


def _keeps_cpu_memory(job) -> bool:
    return job is None or job.config is None or job.config.cpu_memory == "keep"


def _has_passes(job) -> bool:
    return job is not None and any(
        job.passes.get(stage) for stage in ("after_capture", "after_autodiff", "after_split")
    )


def _compile_sharing_blocks(captured: Trace, flat: Trace, lifted, job) -> Compiled | None:
    """Compile with each distinct block transformed and compiled once; None where that cannot
    be done (autodiff must leave the program to PyTorch autograd), for the caller to compile
    ``flat`` instead. Plugin passes and ambient autocast see the whole program, so they take
    the flat path."""
    start = time.perf_counter()
    executors = job.executors if job is not None else ()
    try:
        shared, blocks = share_blocks(captured, lambda trace: _lower(trace, job), executors)
    except NotDifferentiable:
        return None
    shared.provenance = Provenance(f"share blocks ({len(blocks)} distinct)", time.perf_counter() - start)
    try:
        compiled = _compile(shared, lifted, job, autodiff_fallback=False, first=flat)
    except NotDifferentiable:
        return None
    compiled.blocks = blocks
    forward = [t for t in compiled.traces if t.decisions][-1:]
    backward = [t for t in compiled.backward_traces if t.decisions][-1:]
    calls = {}
    for block in blocks:
        note = f"a call of {block.name} ({block.module_class}; compiled once for its {block.calls} calls, its operations are listed below)"
        calls.update({name: note for name in (block.name, f"{block.name}_forward", f"{block.name}_backward")})
    for final in (*forward, *backward):
        for decision in final.decisions:
            if decision.bsym.symbol.name in calls:
                decision.declined, decision.note = {}, calls[decision.bsym.symbol.name]
    for block in blocks:
        for final, traces in ((forward, block.traces), (backward, block.backward_traces)):
            decided = [t for t in traces if t.decisions][-1:]
            if final and decided:
                final[0].decisions = [*final[0].decisions, *decided[0].decisions]
    return compiled


def _compile(
    captured: Trace,
    lifted,
    job,
    *,
    autodiff_fallback: bool = True,
    first: Trace | None = None,
    block_inputs: frozenset = frozenset(),
):
    traces = [captured] if first is None else [first, captured]
    traces.append(dce(traces[-1]))
    traces += _run_passes(traces[-1], job, "after_capture")
    prepared = traces[-1]
    notes = []
    if requires_autodiff(prepared):
        progress.stage("differentiating")
        try:
            with torch.enable_grad():  # the gradient's own ops are recorded as grad mode on
                split = split_forward_backward(prepared, job.executors if job is not None else ())
        except NotDifferentiable as reason:
            if not autodiff_fallback:
                raise
            notes.append(f"autodiff: PyTorch autograd records the whole program ({reason})")
            # Only torch ops are recorded by PyTorch autograd: other executors' kernels would
            # silently drop gradients, so the torch executor runs everything here.
            job = _torch_only(job)
        else:
            forward, backward = split.forward, split.backward
            extra = _run_passes(forward, job, "after_autodiff")
            forward = extra[-1] if extra else forward
            forward, backward = rematerialize(forward, backward)
            block_inputs = frozenset(split.names.get(name, name) for name in block_inputs)
            split_traces = _run_split_passes(forward, backward, job, block_inputs)
            if split_traces:
                forward, backward = split_traces[-1].forward, split_traces[-1].backward
            backward.boxed_inputs = True  # frees each saved tensor after its last use
            forward_traces, backward_traces = _lower(forward, job), _lower(backward, job)
            backward_traces[-1].boxed_inputs = True
            program = TrainingProgram(
                forward_traces[-1].python_callable(),
                backward_traces[-1].python_callable(),
                split.output_differentiable,
                split.output_structure,
                captured.output_treespec,
                split.retain_grad_outputs,
                *(
                    (split.without_gradient, split.outputs_reached)
                    if _names(forward_traces[-1].inputs) == _names(prepared.inputs)
                    else ((), ())
                ),
            )
            if not torch.is_grad_enabled():
                program = _with_grad_enabled(program)
            return Compiled(
                _with_lifted(program, lifted),
                [*traces, split.forward, *extra, *(t.forward for t in split_traces), *forward_traces],
                [split.backward, *(t.backward for t in split_traces), *backward_traces],
                notes,
            )
    traces += _lower(prepared, job)
    return Compiled(_with_lifted(traces[-1].python_callable(), lifted), traces, notes=notes)
