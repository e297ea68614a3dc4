"""Symbols (operations) and bound symbols (one call of an operation in a trace)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thunder_core.ir.proxies import PROXY_TYPES
from thunder_core.ir.tree import leaves, tree_map

# Tags a symbol may carry.
INPLACE = "inplace"  # mutates an argument: a side effect that transforms must keep in order
RANDOM = "random"  # draws from the random number generator
OPAQUE = "opaque"  # a torch call with no thunder_core symbol, run as-is by the torch executor
PYTHON = "python"  # bookkeeping run by the python executor (unpacking, deleting)
AUTOGRAD_FALLBACK = "autograd_fallback"  # differentiated by PyTorch autograd at run time
WHOLE = "whole"  # a fused kernel: claimed whole or run whole by torch, never split for partial claims
RECOMPUTE = "recompute"  # recomputed in the backward from its inputs rather than saved (a gather of a shard)
PROGRAM = "program"  # calls another compiled trace (a repeated block's program), which has its own ranges
EFFECT = "effect"  # acts outside its outputs (a hook registered, a user callback): never dead code
NO_GRAD = "no_grad"  # recorded with grad mode off (capture.grad_mode): runs with it off, never differentiated


class _Recorders(threading.local):
    def __init__(self):
        self.stack: list = []  # the capture recorders in effect in this thread, innermost last


_recorders = _Recorders()


def active_recorder():
    """The recorder that symbol calls currently append to, or None outside capture (per thread)."""
    stack = _recorders.stack
    return stack[-1] if stack else None


def push_recorder(recorder) -> None:
    _recorders.stack.append(recorder)


def pop_recorder() -> None:
    _recorders.stack.pop()


@dataclass(eq=False)
class Symbol:
    """An operation.

    ``impl`` is its meaning on real tensors: the torch executor runs it, and output
    metadata is found by running it on the meta device unless ``meta`` is given.
    Torch-level symbols may have a ``decomposition`` into prims (and other symbols),
    which capture records as the bound symbol's subsymbols.
    """

    name: str
    impl: Callable[..., Any]
    printed_name: str  # how the trace calls it: "torch.add", "prims.add", ...
    is_prim: bool = False
    decomposition: Callable[..., Any] | None = None
    meta: Callable[..., Any] | None = None
    tags: frozenset[str] = field(default_factory=frozenset)
    vjp: Callable[..., Any] | None = None  # a VJP rule of this symbol alone (made-at-compile-time symbols)
    # For an op that updates some arguments only in some calls (batch_norm's running statistics
    # in training): given the bound symbol, whether this call does. Such a call is impure.
    updates_arguments: Callable[[Any], bool] | None = None
    # For a NO_GRAD variant (capture.grad_mode): the symbol it runs under no_grad, which executors
    # claim in its place.
    plain: Symbol | None = None

    def __call__(self, *args, **kwargs):
        recorder = active_recorder()
        if recorder is None:
            return self.impl(*args, **kwargs)
        return recorder.record(self, args, kwargs)

    def __repr__(self) -> str:
        return f"<Symbol {self.printed_name}>"

    def has_tag(self, tag: str) -> bool:
        return tag in self.tags


def _delete(*values) -> None:
    """Reference meaning of ``del``: nothing to compute."""


def _delete_symbol() -> Symbol:
    return Symbol(name="del", impl=_delete, printed_name="del", tags=frozenset({PYTHON}))


@dataclass(frozen=True)
class SourceLocation:
    """The user's line that an operation came from."""

    filename: str
    lineno: int
    function: str
    line: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}: {self.line}"


@dataclass(eq=False)
class BoundSymbol:
    """One call of a symbol in a trace, with its decomposition as ``subsymbols``.

    ``impl`` and ``executor`` are set when an executor claims the call; ``impl`` is then
    what the generated code calls instead of ``symbol.impl``.
    """

    symbol: Symbol
    args: tuple
    kwargs: dict
    output: Any
    subsymbols: list[BoundSymbol] = field(default_factory=list)
    source: SourceLocation | None = None
    executor: str | None = None
    impl: Callable[..., Any] | None = None
    impl_name: str | None = None

    def flat_args(self) -> list:
        """Every proxy among the arguments, in order (may repeat)."""
        return [x for x in leaves((self.args, self.kwargs)) if isinstance(x, PROXY_TYPES)]

    def flat_outputs(self) -> list:
        """Every proxy among the outputs, in order."""
        return [x for x in leaves(self.output) if isinstance(x, PROXY_TYPES)]

    def replace(self, **changes) -> BoundSymbol:
        values = {
            "symbol": self.symbol,
            "args": self.args,
            "kwargs": self.kwargs,
            "output": self.output,
            "subsymbols": self.subsymbols,
            "source": self.source,
            "executor": self.executor,
            "impl": self.impl,
            "impl_name": self.impl_name,
        }
        values.update(changes)
        return BoundSymbol(**values)

    def substitute(self, mapping: dict) -> BoundSymbol:
        """A copy with every proxy found in ``mapping`` (keyed by ``id``) replaced."""

        def swap(x):
            return mapping.get(id(x), x)

        return self.replace(
            args=tree_map(swap, self.args),
            kwargs=tree_map(swap, self.kwargs),
            output=tree_map(swap, self.output),
            subsymbols=[sub.substitute(mapping) for sub in self.subsymbols],
        )

    def __repr__(self) -> str:
        return f"<BoundSymbol {self.symbol.printed_name} -> {[p.name for p in self.flat_outputs()]}>"


def is_impure(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` does something besides computing its outputs: an in-place update, a random
    draw (it advances the generator even when its value is unused) or another effect. Passes never
    remove or reorder such calls among themselves."""
    tags = bsym.symbol.tags
    if INPLACE in tags or RANDOM in tags or EFFECT in tags:
        return True
    updates = bsym.symbol.updates_arguments
    return updates is not None and updates(bsym)


def free_inputs(bound_symbols, produced=()) -> list:
    """The proxies ``bound_symbols`` read that none of them produced before (nor ``produced``
    names), each once, in the order they are first read: the inputs of that run of operations."""
    produced, inputs, seen = set(produced), [], set()
    for b in bound_symbols:
        for p in b.flat_args():
            if p.name not in produced and p.name not in seen:
                seen.add(p.name)
                inputs.append(p)
        produced.update(p.name for p in b.flat_outputs())
    return inputs


#: The ``del`` statement of generated code (run by the python executor).
delete_symbol = _delete_symbol()
