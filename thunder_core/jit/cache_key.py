"""Cache keys: what a compiled trace was specialized on, computed cheaply on every call.

A key holds, per tensor, its shape, strides (its memory layout), dtype, device and requires_grad; per Python number,
string, None, dtype, device, memory format, layout, slice, Ellipsis or enum member, its type
and value; per function, class or Python module, its identity; per container, its type and
length (and keys); per plain Python object (a dataclass, a cache object), its type, its
attribute names and, walked in turn, their values; plus the grad mode. Anything else (a
module, an object without attributes of its own) is rejected with a TypeError naming the
argument and the way out.
"""

from __future__ import annotations

import enum
import math
import types

import torch

from thunder_core.capture.objects import MAX_DEPTH, is_argument_object, object_items

Tensor = torch.Tensor
_VALUE_TYPES = (
    bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.memory_format,
    torch.layout, type(Ellipsis), range,
)  # fmt: skip
_NUMBER_TYPES = (bool, int, float, complex)
_BY_IDENTITY = (
    types.FunctionType, types.BuiltinFunctionType, types.MethodWrapperType, types.WrapperDescriptorType,
    types.MethodDescriptorType, type, types.ModuleType, enum.Enum,
)  # fmt: skip


def float_part(x: float) -> tuple:
    """A float as a key holds it: ``-0.0`` apart from ``0.0`` (they compare equal), every nan
    alike (none equals itself). ``add_to_key`` inlines the same rule."""
    if x == 0.0 or x != x:
        return (float, math.copysign(1.0, x), x == x)
    return (float, x)


def unsupported_argument(path, value) -> TypeError:
    return TypeError(
        f"thunder_core.jit: argument {_path_text(path)!r} has type {type(value).__qualname__}, which a jitted "
        "function cannot take: its attributes could change between calls without the cache seeing it. "
        "Pass tensors, Python numbers, strings, None, dtypes, devices, memory formats, slices, enums, "
        "functions, and tuples, lists, dicts and plain objects (dataclasses) of them; close over other "
        "objects instead (what the trace reads from them is guarded)."
    )


def _path_text(path) -> str:
    """An argument's path, kept as ``(parent, step)`` pairs while walking and formatted only for an
    error: a step is an index (``[0]``), a dict key in a 1-tuple (``['k']``) or an attribute name."""
    steps = []
    while type(path) is tuple:
        path, step = path
        if type(step) is int:
            steps.append(f"[{step}]")
        elif type(step) is tuple:
            steps.append(f"[{step[0]!r}]")
        else:
            steps.append(f".{step}")
    return path + "".join(reversed(steps))


# What ``add_to_key`` does with a value, decided once per type (``_classify``).
_TENSOR, _VALUE, _SLICE, _IDENTITY, _LIST, _SEQUENCE, _DICT, _MAPPING, _OBJECT, _OTHER = range(10)
_KINDS: dict[type, int] = {}
_MAX_KINDS = 4096  # types remembered; others are classified on every call


def _classify(x) -> int:
    if isinstance(x, Tensor):
        return _TENSOR
    if type(x) in _VALUE_TYPES:
        return _VALUE
    if type(x) is slice:
        return _SLICE
    if isinstance(x, _BY_IDENTITY):
        return _IDENTITY
    if type(x) is list:
        return _LIST
    if isinstance(x, (tuple, list)):
        return _SEQUENCE
    if type(x) is dict:
        return _DICT
    if isinstance(x, dict):
        return _MAPPING
    if is_argument_object(x):
        return _OBJECT
    return _OTHER


def _remember_kind(x) -> int:
    kind = _classify(x)
    if len(_KINDS) < _MAX_KINDS:
        _KINDS[type(x)] = kind
    return kind


def add_to_key(x, key: list, leaves: list, path, depth: int = 0, seen: dict | None = None) -> None:
    """Append ``x``'s part of the key; tensors and numbers also go to ``leaves``.

    ``path`` names the argument: a string, or ``(parent path, step)`` for what is inside one.

    ``seen`` (shared by the arguments of one call) holds the plain lists, dicts and objects
    walked so far: one reached again is keyed as that one, and its tensors are not leaves twice
    (capture proxifies each such container once, in place)."""
    kind = _KINDS.get(type(x))
    if kind is None:
        kind = _remember_kind(x)
    if kind == _TENSOR:
        key.append(x.shape)
        key.append(x.stride())
        key.append(x.dtype)
        key.append(x.device)
        key.append(x.requires_grad)
        leaves.append(x)
    elif kind == _VALUE:
        if type(x) is float and (x == 0.0 or x != x):  # float_part, inlined on the hot path
            key.append((float, math.copysign(1.0, x), x == x))
        else:
            key.append((type(x), x))
        if type(x) in _NUMBER_TYPES:
            leaves.append(x)
    elif kind == _SLICE:
        key.append((slice, x.start, x.stop, x.step))
        for part in (x.start, x.stop, x.step):
            if not isinstance(part, (int, type(None))):
                raise unsupported_argument(path, x)
    elif kind == _IDENTITY:
        key.append((type(x), x))  # these compare by identity; the key keeps the object alive
    elif kind == _LIST or kind == _SEQUENCE:
        if kind == _LIST and _seen_before(x, key, seen):
            return
        _check_depth(path, depth)
        key.append((type(x), len(x)))
        for i, item in enumerate(x):
            add_to_key(item, key, leaves, (path, i), depth + 1, seen)
    elif kind == _DICT or kind == _MAPPING:
        if kind == _DICT and _seen_before(x, key, seen):
            return
        _check_depth(path, depth)
        key.append((type(x), tuple(x)))
        for k, item in x.items():
            add_to_key(item, key, leaves, (path, (k,)), depth + 1, seen)
    elif kind == _OBJECT:  # walked by its attributes (thunder_core.capture.objects)
        if _seen_before(x, key, seen):
            return
        _check_depth(path, depth)
        items = object_items(x)
        key.append((type(x), tuple(name for name, _ in items)))
        for name, item in items:
            add_to_key(item, key, leaves, (path, name), depth + 1, seen)
    else:
        raise unsupported_argument(path, x)


def argument_containers(x, depth: int = 0, found: set[int] | None = None) -> set[int]:
    """The ids of the plain lists, dicts and objects that ``x`` holds (the containers whose
    values the key holds), itself included."""
    found = set() if found is None else found
    kind = _KINDS.get(type(x)) or _classify(x)
    if depth > MAX_DEPTH or id(x) in found:
        return found
    if kind in (_LIST, _DICT, _OBJECT):
        found.add(id(x))
    if kind in (_LIST, _SEQUENCE):
        items = x
    elif kind in (_DICT, _MAPPING):
        items = x.values()
    elif kind == _OBJECT:
        items = [item for _, item in object_items(x)]
    else:
        return found
    for item in items:
        argument_containers(item, depth + 1, found)
    return found


def _seen_before(x, key: list, seen: dict | None) -> bool:
    """Whether the list, dict or object ``x`` was walked before in this call (then keyed as that one)."""
    if seen is None:
        return False
    ordinal = seen.get(id(x))
    if ordinal is not None:
        key.append(("same object as", ordinal))
        return True
    seen[id(x)] = len(seen)
    return False


def _check_depth(path, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise TypeError(
            f"thunder_core.jit: argument {_path_text(path)!r} is nested more than {MAX_DEPTH} levels deep (or refers to "
            "itself); pass its tensors, or a flatter object, instead"
        )


def describe(x, path: str, out: dict[str, str]) -> None:
    """Readable ``path -> description`` of what a key holds, for recompilation warnings."""
    if isinstance(x, Tensor):
        out[path] = (
            f"tensor {tuple(x.shape)} {x.dtype} on {x.device}, requires_grad={x.requires_grad}, strides {x.stride()}"
        )
    elif isinstance(x, (tuple, list)):
        out[path] = f"{type(x).__name__} of {len(x)}"
        for i, item in enumerate(x):
            describe(item, f"{path}[{i}]", out)
    elif isinstance(x, dict):
        out[path] = f"dict with keys {list(x)}"
        for k, item in x.items():
            describe(item, f"{path}[{k!r}]", out)
    elif is_argument_object(x):
        items = object_items(x)
        out[path] = f"{type(x).__qualname__} with attributes {[name for name, _ in items]}"
        if path.count(".") < MAX_DEPTH:
            for name, item in items:
                describe(item, f"{path}.{name}", out)
    else:
        out[path] = f"{type(x).__name__} {x!r}"
