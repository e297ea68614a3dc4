"""The compilation pipeline: capture, then each transform, then code generation.

Inference (no gradient needed): capture -> dce -> assign_executors -> delete_last_used.
Training: capture -> dce -> split into forward and backward -> rematerialize -> for each of
the two: dce -> assign_executors -> delete_last_used; the pair runs inside one
``torch.autograd.Function``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder_core.autodiff.joint import NotDifferentiable, requires_autodiff, split_forward_backward
from thunder_core.capture import capture
from thunder_core.executors.claiming import assign_executors
from thunder_core.ir.trace import Trace
from thunder_core.jit.autograd import TrainingProgram
from thunder_core.transforms.dce import dce
from thunder_core.transforms.delete_last_used import delete_last_used
from thunder_core.transforms.rematerialize import rematerialize


@dataclass
class Compiled:
    """One cache entry: the callable that runs, and the traces that led to it."""

    callable: object
    traces: list[Trace]
    backward_traces: list[Trace] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _lower(trace: Trace) -> list[Trace]:
    traces = [trace]
    for transform in (dce, assign_executors, delete_last_used):
        traces.append(transform(traces[-1]))
    return traces


def compile_function(fn, args, kwargs, *, positional_names, extra_inputs=(), extra_binder=None) -> Compiled:
    captured = capture(
        fn,
        args,
        kwargs,
        positional_names=positional_names,
        extra_inputs=extra_inputs,
        extra_binder=extra_binder,
    )
    pruned = dce(captured)
    notes = []
    if requires_autodiff(pruned):
        try:
            split = split_forward_backward(pruned)
        except NotDifferentiable as reason:
            notes.append(f"autodiff: PyTorch autograd records the whole program ({reason})")
        else:
            forward, backward = rematerialize(split.forward, split.backward)
            forward_traces, backward_traces = _lower(forward), _lower(backward)
            program = TrainingProgram(
                forward_traces[-1].python_callable(),
                backward_traces[-1].python_callable(),
                split.output_differentiable,
                split.output_structure,
                captured.output_treespec,
            )
            return Compiled(
                program,
                [captured, pruned, split.forward, *forward_traces],
                [split.backward, *backward_traces],
                notes,
            )
    traces = [captured, *_lower(pruned)]
    return Compiled(traces[-1].python_callable(), traces, notes=notes)
