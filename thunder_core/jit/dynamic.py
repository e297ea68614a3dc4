"""Which sizes a compile makes symbolic, and which cached symbolic entries a call fits.

``jit(fn, dynamic=None)`` (the default) compiles a call with fixed sizes; when a later call
differs from a compiled one only in sizes, it compiles once more with exactly the dimensions
that changed symbolic (as torch.compile's automatic dynamic shapes do), and that entry serves
every later size its guards accept. ``dynamic=True`` makes every dimension of the arguments'
tensors symbolic from the first call; ``dynamic=False`` keeps every size fixed. A module's
parameters and buffers keep fixed sizes. ``ArgumentDims`` names the dimensions to make symbolic
from the first call, by argument position (the torch.compile front end passes those Dynamo made
symbolic); later size changes are handled as with ``None``.

A tensor whose strides change while its sizes do not (a window of a longer buffer: Hugging
Face's sliding-window caches after a prompt of another length) compiles again with its strides
symbolic (``symbolic_strides``, by tensor index). Python ints among the arguments (``n`` in
``f(x, n)``, an ``int`` attribute of an argument object such as a sliding-window cache's
``cumulative_length``) are automatic in every mode but ``False``: a call that differs from an
entry in an int's value compiles once more with that int symbolic (a ``SymInt`` of the same
``ShapeEnv``), as torch.compile's automatic dynamic does for ints; bools and floats stay fixed.
Symbolic ints are named by their position among the call's leaves (``symbolic_ints``).

Cache keys (``cache_key``) hold each tensor's shape (a ``torch.Size``) followed by its strides;
a symbolic entry is found again by comparing a call's key with the key it was compiled for,
ignoring its symbolic dimensions and the strides of its symbolic tensors, which the entry's
size guard checks.
"""

from __future__ import annotations

import torch

DYNAMIC_MODES = (None, True, False)


class ArgumentDims(dict):
    """``{argument position: dims}``: the dimensions of those tensor arguments that the first
    compile makes symbolic, and in ``ints`` the positions of int arguments it makes symbolic;
    later compiles are automatic, as with ``dynamic=None``."""

    ints: frozenset[int] = frozenset()

    def int_leaves(self, leaves, arguments: int) -> frozenset[int]:
        """The leaf positions of those int arguments (0 and 1 are specialized, as sizes are)."""
        return frozenset(
            p for p in self.ints if p < arguments and type(leaves[p]) is int and leaves[p] not in (0, 1)
        )

    def by_tensor(self, leaves, arguments: int) -> dict[int, frozenset[int]]:
        """The same dims keyed by tensor index among ``leaves`` (as compiles key them)."""
        tensors = {p: i for i, p in enumerate(_tensor_positions(leaves))}
        dims = {}
        for p, ds in self.items():
            if p in tensors and p < arguments:
                kept = frozenset(d for d in ds if d < leaves[p].dim())  # a hint: never beyond the tensor
                if kept:
                    dims[tensors[p]] = kept
        return dims


def check_dynamic(dynamic) -> None:
    if dynamic not in DYNAMIC_MODES and not isinstance(dynamic, ArgumentDims):
        raise ValueError(f"thunder_core.jit: dynamic={dynamic!r} must be None (automatic), True or False")


def _tensor_positions(leaves) -> list[int]:
    return [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]


def _is_number(item) -> bool:
    """A number leaf's part of a key: ``(int, 3)``, ``(float, 0.5)``, ``(float, sign, not nan)``, ..."""
    return (
        type(item) is tuple and 2 <= len(item) <= 3 and any(item[0] is t for t in (int, float, bool, complex))
    )


def _differences(old_key: tuple, key: tuple) -> tuple[dict[int, frozenset[int]], set[int], set[int]] | None:
    """Two keys compared leaf by leaf: ``({tensor index: dims whose sizes differ}, {tensor indexes
    whose strides differ}, {leaf positions of ints whose values differ})``; None when they differ
    in anything else."""
    if len(old_key) != len(key):
        return None
    sizes: dict[int, frozenset[int]] = {}
    strides: set[int] = set()
    ints: set[int] = set()
    tensor, leaf, after_shape = -1, -1, False
    for a, b in zip(old_key, key):
        if type(a) is torch.Size:
            if type(b) is not torch.Size or len(a) != len(b):
                return None
            tensor += 1
            leaf += 1
            dims = frozenset(d for d in range(len(a)) if a[d] != b[d])
            if dims:
                sizes[tensor] = dims
            after_shape = True
        elif after_shape:  # a tensor's strides follow its shape in a key
            after_shape = False
            if a != b:
                strides.add(tensor)
        elif _is_number(a):
            leaf += 1
            if type(a) is not type(b) or a != b:
                if a[0] is not int or type(b) is not tuple or len(b) != 2 or b[0] is not int:
                    return None
                ints.add(leaf)
        elif type(a) is not type(b) or a != b:
            return None
    return sizes, strides, ints


def changes(
    old_key: tuple, key: tuple
) -> tuple[dict[int, frozenset[int]], frozenset[int], frozenset[int]] | None:
    """``({tensor index: dims}, {int leaf positions}, {tensor indexes})`` whose sizes, values or
    strides differ between two keys that differ in nothing else; None when they differ otherwise
    or not at all."""
    differences = _differences(old_key, key)
    if differences is None or not any(differences):
        return None
    return differences[0], frozenset(differences[2]), frozenset(differences[1])


def fits(
    template: tuple,
    dims: dict[int, frozenset[int]],
    key: tuple,
    ints: frozenset[int] = frozenset(),
    strides: frozenset[int] = frozenset(),
) -> bool:
    """Whether ``key`` matches the key a symbolic entry was compiled for, up to its symbolic
    dimensions (``dims`` by tensor index), the strides of those tensors and of ``strides``, and
    its symbolic ints (by leaf position): its size guard checks them."""
    differences = _differences(template, key)
    if differences is None:
        return False
    sizes, changed_strides, changed_ints = differences
    return (
        all(changed <= dims.get(t, frozenset()) for t, changed in sizes.items())
        and all(dims.get(t) or t in strides for t in changed_strides)
        and changed_ints <= ints
    )


def by_position(dims: dict[int, frozenset[int]], leaves) -> dict[int, frozenset[int]]:
    """Tensor indexes turned into positions among the call's leaves (the trace's inputs)."""
    positions = _tensor_positions(leaves)
    return {positions[t]: d for t, d in dims.items() if t < len(positions)}


def tensor_positions(tensors, leaves) -> frozenset[int]:
    """Tensor indexes turned into positions among the call's leaves."""
    positions = _tensor_positions(leaves)
    return frozenset(positions[t] for t in tensors if t < len(positions))


def every_dim(leaves, arguments: int) -> dict[int, frozenset[int]]:
    """Every dimension of each tensor among the first ``arguments`` leaves (``dynamic=True``)."""
    positions = [p for p in _tensor_positions(leaves) if p < arguments]
    tensors = {p: i for i, p in enumerate(_tensor_positions(leaves))}
    return {tensors[p]: frozenset(range(leaves[p].dim())) for p in positions if leaves[p].dim()}


def to_make_symbolic(
    dynamic, entries: list, key: tuple, leaves, arguments: int, fixed: set
) -> tuple[dict[int, frozenset[int]], frozenset[int], frozenset[int]]:
    """``({tensor index: dims}, {int leaf positions}, {tensor indexes: strides alone})`` this
    compile makes symbolic, given the compiled ``entries`` (newest last), the ``arguments``
    first leaves (the module state's after them keep fixed sizes) and ``fixed``: what the
    program specialized before, (tensor index, dim), (int leaf position, None) and (tensor
    index, "strides"), not tried again."""
    nothing = frozenset()
    if dynamic is False:
        return {}, nothing, nothing
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    dims: dict[int, frozenset[int]] = {}
    if dynamic is True:
        dims = every_dim(leaves, arguments)
    if dynamic is True and not entries:
        return _worth_trying(dims, tensors, fixed), nothing, nothing
    if isinstance(dynamic, ArgumentDims) and not entries:
        dims = _worth_trying(dynamic.by_tensor(leaves, arguments), tensors, fixed)
        return dims, dynamic.int_leaves(leaves, arguments), nothing
    in_arguments = {
        i
        for i, p in enumerate(p for p, x in enumerate(leaves) if isinstance(x, torch.Tensor))
        if p < arguments
    }
    for compiled in reversed(entries):
        changed = changes(compiled.key, key)
        if (
            changed
            and set(changed[0]) <= in_arguments
            and changed[2] <= in_arguments
            and all(p < arguments for p in changed[1])
        ):
            merged = dict(compiled.symbolic_dims)
            for tensor, ds in (*changed[0].items(), *dims.items()):
                merged[tensor] = merged.get(tensor, frozenset()) | ds
            ints = frozenset(
                p
                for p in compiled.symbolic_ints | changed[1]
                if (p, None) not in fixed and leaves[p] not in (0, 1)  # 0, 1: specialized
            )
            # Sizes the program fixed while these ints were fixed may stay symbolic beside
            # them (a cache's length and the int counting its tokens): tried once more.
            merged = _worth_trying(merged, tensors, fixed, again=bool(ints - compiled.symbolic_ints))
            strides = frozenset(
                t
                for t in compiled.symbolic_strides | changed[2]
                if t not in merged and (t, "strides") not in fixed
            )
            return merged, ints, strides
    return _worth_trying(dims, tensors, fixed), nothing, nothing


def _worth_trying(
    dims: dict[int, frozenset[int]], tensors, fixed: set, again: bool = False
) -> dict[int, frozenset[int]]:
    """``dims`` without those that would be fixed anyway: sizes 0 and 1 (specialized by the
    ShapeEnv) and, unless ``again``, dims the program fixed before."""
    kept = {}
    for tensor, ds in dims.items():
        ds = frozenset(d for d in ds if tensors[tensor].shape[d] > 1 and (again or (tensor, d) not in fixed))
        if ds:
            kept[tensor] = ds
    return kept


def describe_dims(dims: dict[int, frozenset[int]], names: list[str], ints=(), strides=()) -> str:
    """``x dims 0, 1; y dim 0; k strides; int n`` for ``cache_info`` (by trace input position)."""
    parts = []
    for position, ds in sorted(dims.items()):
        name = names[position] if position < len(names) else f"input {position}"
        parts.append(f"{name} dim{'s' if len(ds) > 1 else ''} {', '.join(map(str, sorted(ds)))}")
    for position in sorted(strides):
        parts.append(f"{names[position] if position < len(names) else f'input {position}'} strides")
    for position in sorted(ints):
        parts.append(f"int {names[position] if position < len(names) else f'input {position}'}")
    return "; ".join(parts)
