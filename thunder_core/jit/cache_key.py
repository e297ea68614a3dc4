"""Cache keys: what a compiled trace was specialized on, computed cheaply on every call.

A key holds, per tensor, its shape, strides (its memory layout), dtype, device and requires_grad; per Python number,
string, None, dtype, device, memory format, layout, slice, Ellipsis or enum member, its type
and value; per function, class or Python module, its identity; per container, its type and
length (and keys); plus the grad mode. Anything else (objects whose attributes could change
between calls) is rejected with a TypeError naming the argument and the way out.
"""

from __future__ import annotations

import enum
import math
import types

import torch

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


def unsupported_argument(path: str, value) -> TypeError:
    return TypeError(
        f"thunder_core.jit: argument {path!r} has type {type(value).__qualname__}, which a jitted "
        "function cannot take: its attributes could change between calls without the cache seeing it. "
        "Pass tensors, Python numbers, strings, None, dtypes, devices, memory formats, slices, enums, "
        "functions and tuples/lists/dicts of them; close over other objects instead (what the trace "
        "reads from them is guarded)."
    )


def add_to_key(x, key: list, leaves: list, path: str) -> None:
    """Append ``x``'s part of the key; tensors and numbers also go to ``leaves``."""
    if isinstance(x, Tensor):
        key.append(x.shape)
        key.append(x.stride())
        key.append(x.dtype)
        key.append(x.device)
        key.append(x.requires_grad)
        leaves.append(x)
    elif type(x) in _VALUE_TYPES:
        if type(x) is float and (x == 0.0 or x != x):  # -0.0 == 0.0 and nan != nan: key them apart/together
            key.append((float, math.copysign(1.0, x), x == x))
        else:
            key.append((type(x), x))
        if type(x) in _NUMBER_TYPES:
            leaves.append(x)
    elif type(x) is slice:
        key.append((slice, x.start, x.stop, x.step))
        for part in (x.start, x.stop, x.step):
            if not isinstance(part, (int, type(None))):
                raise unsupported_argument(path, x)
    elif isinstance(x, _BY_IDENTITY):
        key.append((type(x), x))  # these compare by identity; the key keeps the object alive
    elif isinstance(x, (tuple, list)):
        key.append((type(x), len(x)))
        for i, item in enumerate(x):
            add_to_key(item, key, leaves, f"{path}[{i}]")
    elif isinstance(x, dict):
        key.append((type(x), tuple(x)))
        for k, item in x.items():
            add_to_key(item, key, leaves, f"{path}[{k!r}]")
    else:
        raise unsupported_argument(path, x)


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
    else:
        out[path] = f"{type(x).__name__} {x!r}"
