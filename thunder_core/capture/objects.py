"""Python objects among a jitted function's arguments, and what the function does to them.

An argument may be a plain Python object (a dataclass, a Hugging Face ``DynamicCache`` or
``StaticCache``), a list or a dict, nested in one another. The cache key walks them
(``thunder_core.jit.cache_key``): objects by their attributes (``vars``), lists and dicts by their
items; their tensors are inputs of the trace, the rest is keyed by value. While capturing, their
tensors are replaced *in place* by the inputs' proxies, so the function reads and changes the
very objects it was given; afterwards each is compared with what it held before the function
ran, and put back as it was. What changed becomes an ``Epilogue``: after the compiled program
runs, the same changes are made to the objects of that call — an attribute set to a tensor the
program computed (its extra outputs) or to a Python value, an item appended to a list. Tensors
the function updates in place (``index_copy_`` into a ``StaticCache``) are inputs updated by the
program itself.

Outputs may hold argument objects (a ``ModelOutput`` whose ``past_key_values`` is the cache it
was given): the epilogue puts the call's own object there. They may also hold objects the
function created around the tensors it computed (the new ``DynamicCache`` of a Hugging Face
forward called without one): the epilogue makes a new one on every call, as eager does.
"""

from __future__ import annotations

import enum
import functools
import types
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from thunder_core.errors import CaptureError
from thunder_core.ir.proxies import TensorProxy

MAX_DEPTH = 8

# Values stored by reference: immutable, or compared by identity.
_REFERENCED = (
    bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.memory_format,
    torch.layout, type(Ellipsis), range, slice, types.FunctionType, types.BuiltinFunctionType,
    types.MethodType, type, types.ModuleType, enum.Enum,
)  # fmt: skip


def is_argument_object(x) -> bool:
    """A plain Python object whose state is its attributes (``vars``): walked, not keyed by
    identity. Objects that keep state elsewhere too (``__slots__``) are not."""
    return (
        hasattr(x, "__dict__")
        and not isinstance(x, (torch.Tensor, torch.nn.Module, dict, list, tuple, *_REFERENCED))
        and not callable(x)
        and not _has_slots(type(x))
    )


@functools.lru_cache(maxsize=256)
def _has_slots(cls: type) -> bool:
    return any(
        set(
            getattr(klass, "__slots__", ())
            if not isinstance(getattr(klass, "__slots__", ()), str)
            else (klass.__slots__,)
        )
        - {"__dict__", "__weakref__"}
        for klass in cls.__mro__
        if "__slots__" in vars(klass)
    )


def object_items(x) -> list[tuple[str, object]]:
    """An argument object's attributes, in the order the key and the capture walk them."""
    return list(vars(x).items())


def resolve(route: tuple, args: tuple, kwargs: dict):
    """The value at ``route`` (("arg", i) or ("kwarg", name), then ("attr", name) / ("item", key) steps)."""
    kind, first = route[0]
    value = args[first] if kind == "arg" else kwargs[first]
    for kind, step in route[1:]:
        value = vars(value)[step] if kind == "attr" else value[step]
    return value


@dataclass
class _Tracked:
    route: tuple
    container: object
    kind: str  # "object", "list" or "dict"
    original: object  # its items before capture (dict or list)
    proxified: object = None  # its items once its tensors were replaced by proxies

    def items(self):
        if self.kind == "object":
            return dict(vars(self.container))
        return dict(self.container) if self.kind == "dict" else list(self.container)

    def restore(self) -> None:
        if self.kind == "object":
            state = vars(self.container)
            state.clear()
            state.update(self.original)
        elif self.kind == "dict":
            self.container.clear()
            self.container.update(self.original)
        else:
            self.container[:] = self.original


@dataclass
class Epilogue:
    """What a compiled program's caller does after it runs: rebuild the output around the
    argument objects it holds, and make the function's changes to those objects."""

    routes: list[tuple]  # of the argument containers the epilogue touches
    changes: list[tuple]  # (container index, "object" | "dict" | "list", new items spec, removed keys)
    outputs: int  # how many of the program's outputs are the function's own (the rest feed changes)
    treespec: object = None  # rebuilds the function's output from those outputs
    placed: list[tuple[int, int]] = field(default_factory=list)  # (output leaf, container index)
    built: list[tuple[int, tuple]] = field(default_factory=list)  # (output leaf, spec of a new object)
    # Argument tensors stored again as they are (a list rebuilt around them): taken from the call's
    # arguments, not passed through the program (whose outputs autograd would connect to them).
    input_routes: list[tuple] = field(default_factory=list)

    def __call__(self, result, args: tuple, kwargs: dict):
        containers = [resolve(route, args, kwargs) for route in self.routes]
        given = [resolve(route, args, kwargs) for route in self.input_routes]  # before anything changes
        made: dict[int, object] = {}  # the objects the function created, made again for this call
        flat = list(result)
        extra = flat[self.outputs :]
        flat = flat[: self.outputs]
        for leaf, index in self.placed:
            flat[leaf] = containers[index]
        for index, kind, items, removed in self.changes:
            target = containers[index]
            if kind == "list":
                target[:] = [_build(spec, extra, containers, given, made) for spec in items]
                continue
            state = vars(target) if kind == "object" else target
            for key, spec in items:
                state[key] = _build(spec, extra, containers, given, made)
            for key in removed:
                del state[key]
        for leaf, spec in self.built:
            flat[leaf] = _build(spec, extra, containers, given, made)
        if self.treespec is None:
            return flat[0] if flat else None
        return pytree.tree_unflatten(flat, self.treespec)

    def describe(self) -> list[str]:
        """One line per changed argument container, for ``explain``."""
        return [
            f"{_route_text(self.routes[index])}: {kind} updated after the program runs"
            for index, kind, *_ in self.changes
        ] + [
            f"the function's output: a new {spec[1].__qualname__} made after the program runs"
            for _, spec in self.built
            if spec[0] == "new"
        ]


def _made_by(route: tuple) -> str:
    return "object the function created" if route and route[0][0] == "output" else "object"


def _route_text(route: tuple) -> str:
    kind, first = route[0]
    text = {"kwarg": first, "output": "the function's output"}.get(kind, f"args[{first}]")
    for kind, step in route[1:]:
        text += f".{step}" if kind == "attr" else f"[{step!r}]"
    return text


def _build(spec, tensors: list, containers: list, given: list, made: dict):
    tag = spec[0]
    if tag == "value":
        return spec[1]
    if tag == "tensor":
        return tensors[spec[1]]
    if tag == "given":
        return given[spec[1]]
    if tag == "container":
        return containers[spec[1]]
    if tag == "list":
        return [_build(s, tensors, containers, given, made) for s in spec[1]]
    if tag == "tuple":
        return tuple(_build(s, tensors, containers, given, made) for s in spec[1])
    if tag == "namedtuple":
        return spec[1](*(_build(s, tensors, containers, given, made) for s in spec[2]))
    if tag == "dict":
        return {k: _build(s, tensors, containers, given, made) for k, s in spec[1]}
    if tag == "same":  # an object the function created, reached again: the one made for this call
        return made[spec[1]]
    # "new": an object the function created; made again without running its __init__
    obj = made[spec[3]] = spec[1].__new__(spec[1])
    vars(obj).update({k: _build(s, tensors, containers, given, made) for k, s in spec[2]})
    return obj


class ArgumentObjects:
    """The mutable containers among a capture's arguments: proxified in place, then compared and restored."""

    def __init__(self):
        self.tracked: list[_Tracked] = []
        self._index: dict[int, int] = {}
        self.rebuilt: list[tuple[str, object, list]] = []  # (path, copy, its items): must not change
        self.input_routes: dict[
            int, tuple
        ] = {}  # id of an input proxy -> where its tensor is among the arguments

    def track(self, container, kind: str, route: tuple) -> _Tracked | None:
        """Start tracking ``container``; None if it already is (reached twice: proxified once)."""
        if id(container) in self._index:
            return None
        if len(route) > MAX_DEPTH:
            raise CaptureError(
                f"thunder_core.jit: argument {_route_text(route)} is nested more than {MAX_DEPTH} levels deep; "
                "pass its tensors (or a flatter object) instead"
            )
        tracked = _Tracked(route, container, kind, None)
        tracked.original = tracked.items()
        self._index[id(container)] = len(self.tracked)
        self.tracked.append(tracked)
        return tracked

    def proxified(self, tracked: _Tracked) -> None:
        tracked.proxified = tracked.items()

    def restore(self) -> None:
        for tracked in reversed(self.tracked):
            tracked.restore()

    def epilogue(self, out, is_plain) -> tuple[object, Epilogue | None, list]:
        """``(output for the trace, epilogue or None, extra tensors the trace must return)``.

        Compares every tracked container with its proxified state; call before ``restore``."""
        for path, copy, items in self.rebuilt:
            now = [*copy.keys(), *copy.values()] if isinstance(copy, dict) else list(copy)
            if len(now) != len(items) or any(a is not b for a, b in zip(now, items)):
                raise CaptureError(
                    f"thunder_core.jit: the function changes its argument {path} (a {type(copy).__qualname__}), "
                    "which a compiled trace cannot replay on the caller's object. Ways out: pass a plain list, "
                    "dict or object, or return the new value instead."
                )
        builder = _SpecBuilder(self._index, self.input_routes)
        changes = []
        for index, tracked in enumerate(self.tracked):
            now, before = tracked.items(), tracked.proxified
            if tracked.kind == "list":
                if len(now) != len(before) or any(a is not b for a, b in zip(now, before)):
                    changes.append((index, "list", [builder.spec(v, tracked.route) for v in now], ()))
                continue
            items = [
                (k, builder.spec(v, (*tracked.route, ("attr", k))))
                for k, v in now.items()
                if before.get(k, _MISSING) is not v
            ]
            removed = tuple(k for k in before if k not in now)
            if items or removed:
                changes.append((index, tracked.kind, items, removed))
        holds_objects = _holds_tracked(out, self._index)
        flat = treespec = None
        if holds_objects or not is_plain(out):
            flat, treespec = pytree.tree_flatten(out, is_leaf=lambda v: id(v) in self._index)
        creates = flat is not None and any(self._is_new_object(leaf) for leaf in flat)
        if not changes and not holds_objects and not creates:
            return out, None, []
        placed, built = [], []
        if flat is None:
            flat = [out]
        for i, leaf in enumerate(flat):
            if id(leaf) in self._index and self.tracked[self._index[id(leaf)]].container is leaf:
                placed.append((i, self._index[id(leaf)]))
                flat[i] = None
            elif self._is_new_object(leaf):
                built.append((i, builder.spec(leaf, (("output", i),))))
                flat[i] = None
        used = sorted({index for index, *_ in changes} | {index for _, index in placed} | builder.containers)
        renumber = {old: new for new, old in enumerate(used)}
        epilogue = Epilogue(
            routes=[self.tracked[i].route for i in used],
            changes=[
                (renumber[i], kind, _renumber(items, renumber, kind), removed)
                for i, kind, items, removed in changes
            ],
            outputs=len(flat),
            treespec=treespec,
            placed=[(leaf, renumber[i]) for leaf, i in placed],
            built=[(leaf, _renumber_spec(spec, renumber)) for leaf, spec in built],
            input_routes=builder.given,
        )
        return flat, epilogue, builder.tensors

    def _is_new_object(self, value) -> bool:
        """An object of the output that the function made around tensors it computed (made again
        after every call), not one of its arguments."""
        return id(value) not in self._index and is_argument_object(value) and holds_proxy(value)


_MISSING = object()


def _renumber(items, renumber: dict, kind: str):
    if kind == "list":
        return [_renumber_spec(s, renumber) for s in items]
    return [(k, _renumber_spec(s, renumber)) for k, s in items]


def _renumber_spec(spec, renumber: dict):
    tag = spec[0]
    if tag == "container":
        return ("container", renumber[spec[1]])
    if tag in ("list", "tuple"):
        return (tag, [_renumber_spec(s, renumber) for s in spec[1]])
    if tag == "namedtuple":
        return (tag, spec[1], [_renumber_spec(s, renumber) for s in spec[2]])
    if tag == "dict":
        return (tag, [(k, _renumber_spec(s, renumber)) for k, s in spec[1]])
    if tag == "new":
        return (tag, spec[1], [(k, _renumber_spec(s, renumber)) for k, s in spec[2]], spec[3])
    return spec


def _holds_tracked(value, index: dict, depth: int = 0) -> bool:
    if id(value) in index:
        return True
    if depth > MAX_DEPTH:
        return False
    if isinstance(value, (list, tuple)):
        return any(_holds_tracked(v, index, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_holds_tracked(v, index, depth + 1) for v in value.values())
    return False


def holds_proxy(value, budget: int = 20_000, owned: set[int] | None = None) -> bool:
    """Whether ``value`` holds a proxy (one whose ``id`` is in ``owned``, if given): itself, or
    inside lists, tuples, dicts and plain objects (``MAX_DEPTH`` levels deep, looking at
    ``budget`` values at most)."""
    stack, seen = [(value, 0)], set()
    while stack and budget > 0:
        value, depth = stack.pop()
        budget -= 1
        if isinstance(value, TensorProxy):
            if owned is None or id(value) in owned:
                return True
            continue
        if depth > MAX_DEPTH or id(value) in seen:
            continue
        if isinstance(value, (list, tuple)):
            items = value
        elif isinstance(value, dict):
            items = value.values()
        elif is_argument_object(value):
            items = [v for _, v in object_items(value)]
        else:
            continue
        seen.add(id(value))
        stack.extend((v, depth + 1) for v in items)
    return False


class _SpecBuilder:
    """How to make, after the program runs, a value the function left in an argument container."""

    def __init__(self, index: dict[int, int], input_routes: dict[int, tuple]):
        self._index = index
        self._input_routes = input_routes
        self.given: list[tuple] = []  # routes of argument tensors stored as they are
        self.tensors: list = []  # TensorProxy, or SymInt/SymFloat/SymBool: the trace returns them
        self._positions: dict[int, int] = {}
        self.containers: set[int] = set()
        self._made: dict[int, int] = {}  # id of an object the function created -> its ordinal
        self._keep: list = []  # those objects, alive while ids name them

    def spec(self, value, route: tuple, depth: int = 0, fresh: bool = False):
        """``value``'s spec; ``fresh``: it is inside an object the function created."""
        if id(value) in self._index:
            self.containers.add(self._index[id(value)])
            return ("container", self._index[id(value)])
        if isinstance(value, TensorProxy) and self._input_routes.get(id(value)):
            self.given.append(self._input_routes[id(value)])
            return ("given", len(self.given) - 1)
        if isinstance(value, (TensorProxy, torch.SymInt, torch.SymFloat, torch.SymBool)):
            # a tensor the program computes, or a size or int of a symbolic capture (its value
            # for each call): both are outputs of the trace
            position = self._positions.get(id(value))
            if position is None:
                position = self._positions[id(value)] = len(self.tensors)
                self.tensors.append(value)
            return ("tensor", position)
        if fresh and isinstance(value, types.MethodType) and holds_proxy(value.__self__):
            raise CaptureError(
                f"thunder_core.jit: {_route_text(route)} holds a new {_made_by(route)} with a method bound to an object "
                "the function created, which thunder_core cannot make again for each call. Return the tensors, or "
                "leave this function un-jitted."
            )
        if isinstance(value, _REFERENCED) or (
            isinstance(value, torch.Tensor) and not isinstance(value, TensorProxy)
        ):
            return ("value", value)
        if depth > MAX_DEPTH:
            raise CaptureError(
                f"thunder_core.jit: the value stored into {_route_text(route)} is nested too deeply"
            )
        if type(value) is list:
            return ("list", [self.spec(v, route, depth + 1, fresh) for v in value])
        if type(value) is tuple:
            return ("tuple", [self.spec(v, route, depth + 1, fresh) for v in value])
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return ("namedtuple", type(value), [self.spec(v, route, depth + 1, fresh) for v in value])
        if type(value) is dict:
            return ("dict", [(k, self.spec(v, route, depth + 1, fresh)) for k, v in value.items()])
        if is_argument_object(value):
            if id(value) in self._made:
                return ("same", self._made[id(value)])
            if not holds_proxy(value):
                if fresh:
                    raise CaptureError(
                        f"thunder_core.jit: {_route_text(route)} holds a new {_made_by(route)} that holds a "
                        f"{type(value).__qualname__} with no tensor the function computed: thunder_core cannot "
                        "tell whether the function made it (eager makes a new one on every call) or found it "
                        "(the same one on every call). Ways out: return the tensors and build the object "
                        "outside the jitted function, or leave this function un-jitted."
                    )
                return ("value", value)  # an object that existed before: the same one, as in eager
            try:
                type(value).__new__(type(value))
            except Exception as error:  # noqa: BLE001 - its class cannot be made without arguments
                raise CaptureError(
                    f"thunder_core.jit: {_route_text(route)} holds a new {type(value).__qualname__}, which "
                    f"thunder_core cannot make again for each call ({type(value).__qualname__}.__new__ needs "
                    f"arguments: {error}). Return its tensors instead, or leave this function un-jitted."
                ) from error
            ordinal = self._made[id(value)] = len(self._made)
            self._keep.append(value)
            items = [(k, self.spec(v, route, depth + 1, True)) for k, v in object_items(value)]
            return ("new", type(value), items, ordinal)
        raise CaptureError(
            f"thunder_core.jit: the function stores a {type(value).__qualname__} into {_route_text(route)}, "
            "which a compiled trace cannot replay on the caller's object. Store tensors, Python values, "
            "lists, tuples, dicts or plain objects of them."
        )
