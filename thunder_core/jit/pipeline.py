"""The compilation pipeline: capture, then each transform, then code generation."""

from __future__ import annotations

from dataclasses import dataclass

from thunder_core.capture import capture
from thunder_core.executors.claiming import assign_executors
from thunder_core.ir.trace import Trace
from thunder_core.transforms.dce import dce
from thunder_core.transforms.delete_last_used import delete_last_used


@dataclass
class Compiled:
    """One cache entry: the callable that runs, and the traces that led to it."""

    callable: object
    traces: list[Trace]


def compile_function(fn, args, kwargs, *, positional_names, extra_inputs=(), extra_binder=None) -> Compiled:
    traces = [
        capture(
            fn,
            args,
            kwargs,
            positional_names=positional_names,
            extra_inputs=extra_inputs,
            extra_binder=extra_binder,
        )
    ]
    for transform in (dce, assign_executors, delete_last_used):
        traces.append(transform(traces[-1]))
    return Compiled(traces[-1].python_callable(), traces)
