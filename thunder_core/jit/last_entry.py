"""The entry of the last call, tried before a cache key is built (``ThunderFunction.__call__``).

Two fast paths, each remembering one entry and what must hold for a call to take it:

- calls whose positional arguments are all tensors (``_remember_fast``): PyTorch's
  ``TensorGuards`` (one C++ call) over the arguments and the module's parameters and buffers;
  an entry with symbolic sizes leaves those dimensions, and the strides of their tensors, free,
  and its size guard runs after it, so one check serves every size the entry takes;
- calls with keyword arguments or argument objects (``_remember_structured``): a flattener
  generated for the call's structure (``thunder_core.jit.flatten``) returns the leaves the key
  would have collected, or None when the key would have decided otherwise.

Either way the entry's own guard runs before it is used; anything that does not match goes by
the key, as before. What they build is kept on the entry (``Compiled.fast_paths``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from thunder_core.jit.flatten import NotFlattenable, build_flattener, metadata_check

Tensor = torch.Tensor


class StructuredEntry(NamedTuple):
    """The entry a generated flattener serves, and what the state's part of the key was then."""

    grad_mode: bool
    flatten: Callable
    entry: tuple  # (guard check or None, callable, Compiled), as in ThunderFunction._cache
    state_known: tuple | None  # ThunderFunction._state_known when it was remembered
    state_key: tuple | None  # the module state's key (training flags) when it was remembered


def tensor_metadata_check(
    tensors: tuple,
    symbolic_dims: dict[int, frozenset[int]] | None = None,
    free_strides: frozenset[int] = frozenset(),
):
    """A compiled check that tensors have these tensors' type, sizes, strides, dtype, device,
    requires_grad and dispatch keys (PyTorch's own ``TensorGuards``, what Dynamo checks its inputs
    with); None where it is not available or ``tensors`` holds something else.

    ``symbolic_dims`` (``{tensor index: dims}``, an entry with symbolic sizes) leaves those
    sizes free, and all strides of those tensors and of ``free_strides`` (tensor indexes): the
    entry's size guard checks them."""
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        return None
    try:
        return metadata_check(tensors, symbolic_dims or {}, free_strides)
    except NotFlattenable:  # a torch without TensorGuards: the key path serves every call
        return None


class LastEntryPaths:
    """``ThunderFunction``'s memory of its last entry (its ``_fast``, ``_fast_checks``,
    ``_fast_structured``, ``_state`` and ``_state_known`` attributes)."""

    def _remember_fast(self, key: tuple, entry: tuple, leaves, state_key=None) -> None:
        compiled = entry[2]
        if compiled.symbolic:  # one check serves every size the entry takes
            check = compiled.fast_paths.get("tensors")
            if check is None:
                check = compiled.fast_paths["tensors"] = tensor_metadata_check(
                    leaves, compiled.symbolic_dims, compiled.symbolic_strides
                )
        else:
            check = self._fast_checks.get(key)
            if check is None:
                check = self._fast_checks[key] = tensor_metadata_check(leaves)
        self._fast = None if check is None else (key[0], len(leaves), check, entry, state_key)

    def _remember_all_tensors(self, key: tuple, entry: tuple, args: tuple, leaves) -> None:
        """``_remember_fast`` for a call of tensors alone (``leaves``: them, then the module state's)."""
        state = self._state
        if state is None:
            self._remember_fast(key, entry, args)
        elif len(leaves) == len(args) + len(state.slots):
            self._remember_fast(key, entry, leaves, state.key())

    def _remember_structured(self, key: tuple, entry: tuple, compiled, args, kwargs) -> None:
        """Serve the next calls with this call's structure through a generated flattener instead
        of the key, built once per entry and key (once per entry with symbolic sizes: it serves
        every size)."""
        slot = None if compiled.symbolic else key
        flatten = compiled.fast_paths.get(slot)
        if flatten is None:
            flatten = compiled.fast_paths[slot] = (
                build_flattener(
                    args, kwargs, compiled.symbolic_dims, compiled.symbolic_ints, compiled.symbolic_strides
                )
                or False
            )
        known = self._state_known
        if flatten is False or (self._state is not None and known is None):
            self._fast_structured = None
            return
        state_key = self._state.key() if self._state is not None else None
        self._fast_structured = StructuredEntry(key[0], flatten, entry, known, state_key)

    def _structured_hit(self, fast: StructuredEntry, args, kwargs):
        """The leaves of this call if it takes the last structured call's entry, else None."""
        leaves = fast.flatten(args, kwargs)
        if leaves is None:
            return None
        state = self._state
        if state is not None:
            known = fast.state_known
            tensors = state.tensors()
            if known is not self._state_known or state.key() != fast.state_key or len(tensors) != known[0]:
                return None
            if not known[1](*tensors):
                return None
            leaves.extend(tensors)
        compiled = fast.entry[2]
        if compiled.symbolic and not compiled.size_guard(leaves):
            return None
        return leaves

    def _structured_is_current(self, structured: StructuredEntry | None, entry: tuple) -> bool:
        return (
            structured is not None
            and structured.entry is entry
            and structured.state_known is self._state_known
        )
