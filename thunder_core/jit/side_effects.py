"""What a capture left in Python state that the program reads: traced tensors and symbolic sizes.

Capture runs the user's Python once, so what it writes into Python state (a counter in
``self``, a list it appends to, a global) is written once, by the capture. Values the program
reads are guarded as they were before, so the next call sees the change and compiles again, as
eager would run the function anew. Two kinds of value cannot stay where the capture left them:

- a traced tensor (``TensorProxy``): a stand-in without data. The capture is refused.
- a symbolic size (``x.shape[0]`` in a program compiled for changing shapes is a ``SymInt``):
  eager would have left an ``int``. It is replaced by its value for this call, and the program
  is specialized on it (a guard of its ``ShapeEnv``): a later call of another size compiles
  again, so its own Python writes its own value.

Only values of this capture count: a trace kept in a global from an earlier capture
(``trace = thunder_core.last_traces(f)[-1]`` in a notebook) holds proxies of its own.
"""

from __future__ import annotations

import torch

from thunder_core.capture.objects import MAX_DEPTH, holds_proxy, is_argument_object, object_items
from thunder_core.errors import CaptureError
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.trace import Trace

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_BUDGET = 20_000  # values looked at per namespace entry, at most


def proxies_of(trace: Trace) -> set[int]:
    """The identities of the tensor proxies a capture made: its inputs and every value its
    operations (and their decompositions) read or produce."""
    owned = {id(p) for p in trace.inputs if isinstance(p, TensorProxy)}
    stack = list(trace.bound_symbols)
    while stack:
        bsym = stack.pop()
        owned.update(id(p) for p in (*bsym.flat_args(), *bsym.flat_outputs()) if isinstance(p, TensorProxy))
        stack.extend(bsym.subsymbols)
    return owned


class Concretizer:
    """Replaces the symbolic sizes of one ``ShapeEnv`` found in Python values by their values
    for this call (``int(s)``, which adds the guard ``s == value``), in place where the container
    allows it (lists, dicts, plain objects, through their ``__dict__``) and by a rebuilt tuple
    otherwise. Best effort: a container that refuses the change keeps what it holds."""

    def __init__(self, shape_env):
        self.shape_env = shape_env
        self.replaced = 0
        self._budget = 0
        self._seen: dict[int, tuple[object, object]] = {}  # id -> (original, replacement): both kept alive

    def _ours(self, value) -> bool:
        return isinstance(value, _SYMBOLIC) and value.node.shape_env is self.shape_env

    def concrete(self, value):
        """``value`` with this environment's symbolic sizes made concrete (the same object
        unless it is one, or a tuple holding one), looking at ``_BUDGET`` values at most."""
        self._budget = _BUDGET
        try:
            return self._concrete(value, 0)
        except Exception:  # noqa: BLE001 - a container that refuses the change is left as it is
            return value

    def _concrete(self, value, depth: int):
        self._budget -= 1
        if self._ours(value):
            self.replaced += 1
            kind = (
                int
                if isinstance(value, torch.SymInt)
                else float
                if isinstance(value, torch.SymFloat)
                else bool
            )
            return kind(value)
        if (
            self._budget <= 0
            or depth > MAX_DEPTH
            or isinstance(value, (str, bytes, int, float, torch.Tensor))
        ):
            return value
        seen = self._seen.get(id(value))
        if seen is not None:
            return seen[1]
        self._seen[id(value)] = (value, value)
        if isinstance(value, list):
            for i, item in enumerate(value):
                new = self._concrete(item, depth + 1)
                if new is not item:
                    value[i] = new
        elif isinstance(value, dict):
            for key, item in list(value.items()):
                new = self._concrete(item, depth + 1)
                if new is not item:
                    value[key] = new
        elif isinstance(value, tuple):
            items = [self._concrete(item, depth + 1) for item in value]
            if any(new is not old for new, old in zip(items, value)):
                try:
                    rebuilt = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
                except Exception:  # noqa: BLE001 - a tuple type that cannot be rebuilt so
                    return value
                self._seen[id(value)] = (value, rebuilt)
                return rebuilt
        elif is_argument_object(value):
            attributes = vars(value)
            for name, item in object_items(value):
                new = self._concrete(item, depth + 1)
                if new is not item:
                    attributes[name] = new  # as stored: no __setattr__, no property (a frozen dataclass too)
        return value


def check_side_effects(compiled, namespaces) -> None:
    """Refuse a capture that stored a traced tensor into Python state, make concrete the symbolic
    sizes it stored there (``thunder_core.jit.side_effects``); note other changes it made.

    Python values the function changes while it runs (a counter in ``self``, a global) were
    guarded as they were before the call, so the next call sees the change and recompiles, as
    eager would run the function anew.
    """
    guard = compiled.guard
    try:
        unchanged = guard.check() is None  # the usual answer, without compiling every check apart
    except Exception:  # noqa: BLE001 - a check that raises is listed by failures() below
        unchanged = False
    changed = [] if unchanged else guard.failures()
    owned = proxies_of(compiled.captured) if compiled.captured is not None else set()
    leaked = [
        guard.descriptions[index][0] for index, current in changed if holds_proxy(current, _BUDGET, owned)
    ]
    for namespace, owner in namespaces:
        leaked += [
            f"{owner}.{key}" for key, value in list(namespace.items()) if holds_proxy(value, _BUDGET, owned)
        ]
    if leaked:
        raise CaptureError(
            f"thunder_core.jit: while being captured, the function stored a tensor it computed into "
            f"{leaked[0]}. A compiled trace cannot replay this Python side effect. Ways out: update an "
            "existing tensor (a registered buffer) in place, e.g. self.buf.copy_(new); return the tensor "
            "instead; or leave this function un-jitted."
        )
    if compiled.size_guard is not None:
        _make_stored_sizes_concrete(compiled, namespaces)
    if changed:
        described = "; ".join(guard.describe(f) for f in changed[:3])
        compiled.notes.append(
            f"guards: the function changed Python state it reads ({described}); the next call recompiles"
        )


def _make_stored_sizes_concrete(compiled, namespaces) -> None:
    """Symbolic sizes the capture stored into Python state become this call's ints, and the
    program is specialized on them (its size guard taken again)."""
    concretizer = Concretizer(compiled.size_guard.sizes.shape_env)
    for namespace, _ in namespaces:
        for key, value in list(namespace.items()):
            new = concretizer.concrete(value)
            if new is not value:
                namespace[key] = new
    if concretizer.replaced:
        compiled.size_guard = compiled.size_guard.taken_again()
        compiled.notes.append(
            "sizes: the function stored a size into Python state; this program is specialized on "
            "the sizes it stored (another size compiles again, as its own Python would store another value)"
        )
