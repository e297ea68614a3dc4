"""Cache keys: what a compiled trace was specialized on, computed cheaply on every call.

A key holds, per tensor, its shape, dtype, device and requires_grad; per Python number,
string, dtype, device or None, its type and value; per container, its type and length
(and keys); plus the grad mode. Anything else is rejected with a TypeError naming the
argument.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor
_VALUE_TYPES = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, type(Ellipsis))
_NUMBER_TYPES = (bool, int, float, complex)


def unsupported_argument(path: str, value) -> TypeError:
    return TypeError(
        f"thunder_core.jit: argument {path!r} has type {type(value).__qualname__}, which a jitted "
        "function cannot take. Pass tensors, Python numbers, strings, None, dtypes, devices and "
        "tuples/lists/dicts of them; close over other objects instead (the trace is specialized on them)."
    )


def add_to_key(x, key: list, leaves: list, path: str) -> None:
    """Append ``x``'s part of the key; tensors and numbers also go to ``leaves``."""
    if isinstance(x, Tensor):
        key.append(x.shape)
        key.append(x.dtype)
        key.append(x.device)
        key.append(x.requires_grad)
        leaves.append(x)
    elif type(x) in _VALUE_TYPES:
        key.append((type(x), x))
        if type(x) in _NUMBER_TYPES:
            leaves.append(x)
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
        out[path] = f"tensor {tuple(x.shape)} {x.dtype} on {x.device}, requires_grad={x.requires_grad}"
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
