"""Fusion regions that overwrite their inputs in place.

Capture records an in-place update as an opaque call (``cache.index_copy_(2, position, k)``)
that keeps its argument's name. A fusion executor may claim the updates that overwrite part of
a tensor with values computed elsewhere (``overwrites``: ``index_copy_``, ``index_put_``
without accumulation, ``copy_``, item assignment, ``fill_``, ``zero_``, ``masked_fill_``,
``index_fill_``), as a Hugging Face ``StaticCache`` writes each new key and value, so that the
ops on both sides of the write run in one region: the region writes into the tensor it is
given, and what the program reads afterwards under that name is that same tensor.

Such a region is compiled assuming that the tensors it writes share no memory with its other
inputs (a compiler that functionalizes the write reads its other inputs as they were before
it). ``SeparateInputs`` checks that on every call and runs the region's own operations with
torch when it does not hold (a view of the cache passed beside the cache itself).

A region is *restartable* (``restartable``) when running its operations again from the start
after a partial run gives the same results and leaves the same values: each tensor it writes
is written once, by an overwrite, and read by nothing in the region before that write. Such a
region may fall back to its torch operations after a failed first run and compile on the
background worker, like a region without effects; any other region with effects does neither.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import INPLACE, BoundSymbol, is_impure
from thunder_core.ops.shapes import always_a_view
from thunder_core.transforms.updates import Aliases, written_arguments

# Methods that replace the values they write without reading them.
_OVERWRITES = frozenset(
    {"index_copy_", "index_put_", "copy_", "__setitem__", "fill_", "zero_", "masked_fill_", "index_fill_"}
)


def overwrites(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` is an in-place update that only overwrites the tensor it writes
    (``cache.index_copy_(dim, index, source)``, ``x[i] = y``, ``x.fill_(0)``)."""
    if not bsym.symbol.has_tag(INPLACE):
        return False
    name = getattr(bsym.symbol.impl, "__name__", "")
    if name not in _OVERWRITES or bsym.kwargs.get("out") is not None:
        return False
    if name == "index_put_":
        accumulate = bsym.kwargs.get("accumulate", bsym.args[3] if len(bsym.args) > 3 else False)
        return accumulate is False
    return True


def _reads_values(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` may read its tensors' values: anything but a view that never copies."""
    return not always_a_view(bsym)


def _tensor_names(bsym: BoundSymbol) -> list[str]:
    return [p.name for p in bsym.flat_args() if isinstance(p, TensorProxy)]


# Ops that may return their argument itself (``x.contiguous()`` of a contiguous tensor,
# ``x.to(x.dtype)``, ``x.detach()`` shares its memory): a write to the result may be a write to it.
_MAY_RETURN_ARGUMENT = frozenset(
    {"detach", "contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16", "int",
     "long", "short", "bool", "cpu", "cuda", "requires_grad_"}
)  # fmt: skip


class _Aliases(Aliases):
    """``Aliases``, where the result of an op that may return its argument aliases it too."""

    def note(self, step: BoundSymbol, tensors: list[str]) -> None:
        super().note(step, tensors)
        if tensors and step.symbol.name in _MAY_RETURN_ARGUMENT:
            for out in step.flat_outputs():
                if isinstance(out, TensorProxy) and self.root(out.name) != self.root(tensors[0]):
                    self._parent[self.root(out.name)] = self.root(tensors[0])


def written_roots(bsyms: list[BoundSymbol]) -> tuple[set[str], Aliases]:
    """The tensors (by the name of what they view, ``Aliases.root``) that ``bsyms`` update in
    place, and the aliases learned over them."""
    aliases = _Aliases()
    written: set[str] = set()
    for step in bsyms:
        tensors = _tensor_names(step)
        if step.symbol.has_tag(INPLACE):
            written |= {aliases.root(p.name) for p in written_arguments(step)}
        aliases.note(step, tensors)
    return written, aliases


def restartable(bsyms: list[BoundSymbol]) -> bool:
    """Whether running ``bsyms`` again from the start after a partial run gives the same results
    and leaves the same values: no effect but overwrites, each tensor written once, and nothing
    reads a written tensor (or a view of it) before its write."""
    aliases = _Aliases()
    written: set[str] = set()
    read: set[str] = set()
    for step in bsyms:
        tensors = _tensor_names(step)
        if step.symbol.has_tag(INPLACE):
            if not overwrites(step) or any(is_impure(s) for s in step.subsymbols):
                return False
            targets = {p.name for p in written_arguments(step)}
            roots = {aliases.root(name) for name in targets}
            sources = {aliases.root(name) for name in tensors if name not in targets}
            if roots & (written | read | sources):
                return False
            written |= roots
            read |= sources
        elif is_impure(step):
            return False
        elif _reads_values(step):
            read |= {aliases.root(name) for name in tensors}
        aliases.note(step, tensors)
    return True


def written_positions(inputs: list, bsyms: list[BoundSymbol]) -> tuple[int, ...]:
    """Positions of the ``inputs`` of a region made of ``bsyms`` that it may write in place
    (directly, through a view it makes of them, or through an op that may return its argument
    itself: ``x.detach()``, ``x.contiguous()``)."""
    roots, aliases = written_roots(bsyms)
    if not roots:
        return ()
    return tuple(
        i for i, p in enumerate(inputs) if isinstance(p, TensorProxy) and aliases.root(p.name) in roots
    )


def separate_written_inputs(compiled: Callable, region, make_fallback: Callable[[], Callable]) -> Callable:
    """``compiled`` (a region's compiled callable), checked by ``SeparateInputs`` on each call if
    the region writes some of its inputs."""
    bsyms = region.bound_symbols
    if not any(b.symbol.has_tag(INPLACE) for b in bsyms):
        return compiled
    written = written_positions(region.inputs, bsyms)
    if not written:
        return compiled
    others = [i for i, p in enumerate(region.inputs) if isinstance(p, TensorProxy) and i not in written]
    return SeparateInputs(compiled, make_fallback, written, others)


class SeparateInputs:
    """A compiled region that writes some of its inputs, called only when those share no memory
    with its other inputs; ``fallback()`` (the region's operations run by torch) otherwise."""

    def __init__(self, compiled: Callable, make_fallback: Callable[[], Callable], written, others):
        self.compiled = compiled
        self._make_fallback = make_fallback
        self._fallback: Callable | None = None
        self._written = tuple(written)
        self._others = tuple(others)
        self.__name__ = getattr(compiled, "__name__", "region")

    def __getattr__(self, name: str):
        if name == "compiled":
            raise AttributeError(name)
        return getattr(self.compiled, name)

    def separate(self, args) -> bool:
        """Whether the written arguments share storage with no other argument (nor each other)."""
        try:
            written = {args[i].untyped_storage().data_ptr() for i in self._written}
            if len(written) != len(self._written) or 0 in written:
                return False
            return not any(args[i].untyped_storage().data_ptr() in written for i in self._others)
        except (AttributeError, RuntimeError, NotImplementedError):  # no plain storage: assume the worst
            return False

    def __call__(self, *args):
        if self.separate(args):
            return self.compiled(*args)
        if self._fallback is None:
            self._fallback = self._make_fallback()
        return self._fallback(*args)
