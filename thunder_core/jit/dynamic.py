"""Which sizes a compile makes symbolic, and which cached symbolic entries a call fits.

``jit(fn, dynamic=None)`` (the default) compiles a call with fixed sizes; when a later call
differs from a compiled one only in sizes, it compiles once more with exactly the dimensions
that changed symbolic (as torch.compile's automatic dynamic shapes do), and that entry serves
every later size its guards accept. ``dynamic=True`` makes every dimension of the arguments'
tensors symbolic from the first call; ``dynamic=False`` keeps every size fixed. A module's
parameters and buffers keep fixed sizes.

Cache keys (``cache_key``) hold each tensor's shape (a ``torch.Size``) followed by its strides;
a symbolic entry is found again by comparing a call's key with the key it was compiled for,
ignoring its symbolic dimensions and the strides of its symbolic tensors, which the entry's
size guard checks.
"""

from __future__ import annotations

import torch

DYNAMIC_MODES = (None, True, False)


def check_dynamic(dynamic) -> None:
    if dynamic not in DYNAMIC_MODES:
        raise ValueError(f"thunder_core.jit: dynamic={dynamic!r} must be None (automatic), True or False")


def _tensor_positions(leaves) -> list[int]:
    return [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]


def changed_dims(old_key: tuple, key: tuple) -> dict[int, frozenset[int]] | None:
    """``{tensor index: dims}`` whose sizes differ between two keys that differ in nothing else
    (strides aside); None when they differ otherwise or not at all."""
    if len(old_key) != len(key):
        return None
    changed: dict[int, frozenset[int]] = {}
    tensor, after_shape = -1, False
    for a, b in zip(old_key, key):
        if type(a) is torch.Size:
            if type(b) is not torch.Size or len(a) != len(b):
                return None
            tensor += 1
            dims = frozenset(d for d in range(len(a)) if a[d] != b[d])
            if dims:
                changed[tensor] = dims
            after_shape = True
            continue
        if after_shape:  # the strides: they follow from the sizes (a layout change is a guard's)
            after_shape = False
            continue
        if type(a) is not type(b) or a != b:
            return None
    return changed or None


def fits(template: tuple, dims: dict[int, frozenset[int]], key: tuple) -> bool:
    """Whether ``key`` matches the key a symbolic entry was compiled for, up to its symbolic
    dimensions (``dims`` by tensor index) and those tensors' strides."""
    if len(template) != len(key):
        return False
    tensor, skip_strides = -1, False
    for a, b in zip(template, key):
        if type(a) is torch.Size:
            if type(b) is not torch.Size or len(a) != len(b):
                return False
            tensor += 1
            symbolic = dims.get(tensor, frozenset())
            if any(a[d] != b[d] for d in range(len(a)) if d not in symbolic):
                return False
            skip_strides = bool(symbolic)
            continue
        if skip_strides:
            skip_strides = False
            continue
        if type(a) is not type(b) or a != b:
            return False
    return True


def by_position(dims: dict[int, frozenset[int]], leaves) -> dict[int, frozenset[int]]:
    """Tensor indexes turned into positions among the call's leaves (the trace's inputs)."""
    positions = _tensor_positions(leaves)
    return {positions[t]: d for t, d in dims.items() if t < len(positions)}


def every_dim(leaves, arguments: int) -> dict[int, frozenset[int]]:
    """Every dimension of each tensor among the first ``arguments`` leaves (``dynamic=True``)."""
    positions = [p for p in _tensor_positions(leaves) if p < arguments]
    tensors = {p: i for i, p in enumerate(_tensor_positions(leaves))}
    return {tensors[p]: frozenset(range(leaves[p].dim())) for p in positions if leaves[p].dim()}


def describe_dims(dims: dict[int, frozenset[int]], names: list[str]) -> str:
    """``x dims 0, 1; y dim 0`` for ``cache_info`` (by trace input names)."""
    parts = []
    for position, ds in sorted(dims.items()):
        name = names[position] if position < len(names) else f"input {position}"
        parts.append(f"{name} dim{'s' if len(ds) > 1 else ''} {', '.join(map(str, sorted(ds)))}")
    return "; ".join(parts)
