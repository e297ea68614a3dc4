"""Traces: a program as inputs, bound symbols and outputs, printable as Python."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thunder_core.ir.symbols import BoundSymbol


@dataclass(frozen=True)
class Provenance:
    """Which pass made a trace and how long that pass took."""

    pass_name: str
    seconds: float

    def __str__(self) -> str:
        return f"Constructed by {self.pass_name} (took {self.seconds * 1e3:.2f} ms)"


@dataclass(eq=False)
class Trace:
    """A captured program.

    ``inputs`` are the parameters of the generated function (flattened leaves of the
    user's arguments, then parameters and buffers for modules). ``output`` is a nested
    tuple/list/dict of proxies and constants; when the user's function returned another
    container (a dataclass, a ``ModelOutput``), ``output_treespec`` rebuilds it.

    With ``boxed_inputs`` the generated function takes one list holding the inputs and empties
    it, so that (with the caller keeping no other reference) each input is freed right after
    its last use instead of when the call returns: how a backward frees the forward's saved
    tensors as it goes.
    """

    inputs: list
    bound_symbols: list[BoundSymbol]
    output: Any
    function_name: str = "computation"
    provenance: Provenance | None = None
    output_treespec: Any = None
    decisions: list = field(default_factory=list, repr=False)  # set by assign_executors, read by explain
    given_back: dict = field(
        default_factory=dict, repr=False
    )  # set by fusion passes: name -> why torch runs it
    boxed_inputs: bool = False
    # Set on a captured trace whose function changed or returned its argument objects: what the
    # caller does after the program runs (thunder_core.capture.objects.Epilogue).
    epilogue: Any = field(default=None, repr=False)
    _callable: Any = field(default=None, repr=False)

    def with_bound_symbols(
        self, bound_symbols: list[BoundSymbol], provenance: Provenance | None = None
    ) -> Trace:
        """A new trace with the same signature and other bound symbols."""
        return Trace(
            inputs=self.inputs,
            bound_symbols=bound_symbols,
            output=self.output,
            function_name=self.function_name,
            provenance=provenance,
            output_treespec=self.output_treespec,
            boxed_inputs=self.boxed_inputs,
        )

    def python_code(self, *, subsymbol_depth: int = 1):
        from thunder_core.ir.codegen import trace_to_python

        return trace_to_python(self, subsymbol_depth=subsymbol_depth)

    def python(self, *, subsymbol_depth: int = 1) -> str:
        """The trace as valid, readable Python source."""
        return self.python_code(subsymbol_depth=subsymbol_depth).source

    def python_callable(self):
        """Compile the trace into a Python function taking ``inputs`` in order."""
        if self._callable is None:
            from thunder_core.ir.codegen import trace_to_python

            self._callable = trace_to_python(self, subsymbol_depth=0, profiler_switch=True).callable()
        return self._callable

    def __str__(self) -> str:
        return self.python()

    def __repr__(self) -> str:
        return f"<Trace {self.provenance or ''}: {len(self.bound_symbols)} bound symbols>"


@dataclass(eq=False)
class TrainingTraces:
    """What an ``after_split`` pass receives and returns: the forward trace (returning
    ``(outputs, saved)``), the backward trace (taking ``(*saved, *grads)``), and the names of the
    tensors that entered each call of a repeated block (a model's layers), for passes that work
    per layer such as activation checkpointing."""

    forward: Trace
    backward: Trace
    block_inputs: frozenset = frozenset()
