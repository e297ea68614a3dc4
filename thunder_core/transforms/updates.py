"""Which tensors a trace updates in place, with everything that aliases them.

In the IR an in-place op keeps its argument's name (``t0 = torch.Tensor.mul_(t0, 2)``), so a
name alone does not say which value it holds at a given point. A pass that computes a value
again later (rematerialization in the backward) or once for several points (a repeated block's
shared arguments) must not read a name that some operation updates: it would see the value
after the update.
"""

from __future__ import annotations

from collections.abc import Iterable

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import EFFECT, INPLACE, BoundSymbol
from thunder_core.ir.tree import leaves
from thunder_core.ops.registry import operator_schema
from thunder_core.ops.shapes import VIEW_OPS


def _steps(bsyms: Iterable[BoundSymbol]):
    for bsym in bsyms:
        yield bsym
        yield from _steps(bsym.subsymbols)


def _tensors(value) -> list[TensorProxy]:
    return [p for p in leaves(value) if isinstance(p, TensorProxy)]


def written_arguments(step: BoundSymbol) -> list[TensorProxy]:
    """The tensor arguments an in-place operation writes: its ``out=`` tensors, else those its
    operator schema marks written (``Tensor(a!)``), else the tensors of its first argument that
    holds any (``x.add_(y)``, ``x[i] = y``, ``cache.index_copy_(dim, index, source)``: the source
    is only read; ``torch._foreach_add_(tensors, others)``: every tensor of the first list)."""
    if step.kwargs.get("out") is not None:
        return _tensors(step.kwargs["out"])
    schema = operator_schema(step.symbol.impl)
    if schema is not None:
        written = []
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                value = step.args[position] if position < len(step.args) else step.kwargs.get(argument.name)
                written += _tensors(value)
        if written:
            return written
    for value in (*step.args, *step.kwargs.values()):
        if _tensors(value):
            return _tensors(value)
    return []


class Aliases:
    """Which tensor each name may alias, learned operation by operation: the result of a view
    (``x.T`` too, whose decomposition is a permute) or of an in-place operation aliases the
    (first) tensor it views or writes."""

    def __init__(self):
        self._parent: dict[str, str] = {}

    def root(self, name: str) -> str:
        while self._parent.get(name, name) != name:
            name = self._parent[name]
        return name

    def note(self, step: BoundSymbol, tensors: list[str]) -> None:
        symbol = step.symbol
        view = symbol.name in VIEW_OPS or (
            step.subsymbols and all(sub.symbol.name in VIEW_OPS for sub in step.subsymbols)
        )
        if tensors and (view or symbol.has_tag(INPLACE)):
            for out in step.flat_outputs():
                if isinstance(out, TensorProxy) and self.root(out.name) != self.root(tensors[0]):
                    self._parent[self.root(out.name)] = self.root(tensors[0])


def updated_in_place(bsyms: list[BoundSymbol], start: int = 0, stop: int | None = None) -> set[str]:
    """Names of the tensors that an operation of ``bsyms[start:stop]`` (or of their subsymbols)
    may update in place (what an in-place op writes; every tensor argument of an op that updates
    an argument it is given, such as batch norm's running statistics, or of an op with other
    effects, such as a hook), together with every view of them and every tensor they are views
    of (anywhere in ``bsyms``)."""
    within = {id(s) for s in _steps(bsyms[start:stop])}
    steps = list(_steps(bsyms))
    aliases = Aliases()
    updated = []
    for step in steps:
        tensors = [p.name for p in step.flat_args() if isinstance(p, TensorProxy)]
        symbol = step.symbol
        effect = symbol.has_tag(EFFECT) or (
            symbol.updates_arguments is not None and symbol.updates_arguments(step)
        )
        if symbol.has_tag(INPLACE) and not effect:
            tensors = [p.name for p in written_arguments(step)]  # the others are only read
        if (effect or symbol.has_tag(INPLACE)) and id(step) in within:
            updated.extend(tensors)
        aliases.note(step, tensors)
    if not updated:
        return set()
    roots = {aliases.root(name) for name in updated}
    names = {
        p.name
        for step in steps
        for p in (*step.flat_args(), *step.flat_outputs())
        if isinstance(p, TensorProxy)
    }
    return {name for name in names if aliases.root(name) in roots}
