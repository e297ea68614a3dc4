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

from thunder_core.capture.objects import MAX_DEPTH, is_argument_object, object_items
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


def _items(value):
    """The values inside a container the walk enters, or None."""
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, dict):
        return value.values()
    if is_argument_object(value):
        return [v for _, v in object_items(value)]
    return None


def holds_proxy_of(value, owned: set[int]) -> bool:
    """Whether ``value`` holds one of the ``owned`` proxies: itself, or inside lists, tuples,
    dicts and plain objects (``MAX_DEPTH`` levels deep, ``_BUDGET`` values at most)."""
    stack, seen, budget = [(value, 0)], set(), _BUDGET
    while stack and budget > 0:
        value, depth = stack.pop()
        budget -= 1
        if isinstance(value, TensorProxy):
            if id(value) in owned:
                return True
            continue
        if depth > MAX_DEPTH or id(value) in seen:
            continue
        items = _items(value)
        if items is not None:
            seen.add(id(value))
            stack.extend((v, depth + 1) for v in items)
    return False


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
