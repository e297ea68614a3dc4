"""Reusing a compiled entry for a module tree in which submodules were replaced by equal ones
(litgpt's ``set_kv_cache`` builds new cache modules for every prompt)."""

from __future__ import annotations

from thunder_core.jit.guards import GuardBuilder


def rebind(old_tokens: list, old_tree: int, old_failures: list, new_builder: GuardBuilder) -> bool:
    """Whether a compiled entry stays valid for a module tree in which submodules were replaced.

    True when every failing check of the entry's guard is the identity of a submodule found by
    walking the roots (``old_failures`` indexes ``old_tokens``' tree part), and a fresh walk of
    the roots (``new_builder``) pins down the same things: the same paths, values, array
    contents and object identities, and submodules of the same classes at the same places.
    The entry's parameters and buffers are inputs read on every call, so its trace holds for
    the new submodules exactly when everything else it was specialized on is unchanged.
    """
    if not old_failures or any(
        index >= old_tree or old_tokens[index][0] != "module" for index, _ in old_failures
    ):
        return False
    if new_builder.tree_checks != old_tree:
        return False
    for old, new in zip(old_tokens[:old_tree], new_builder.tokens[:old_tree]):
        if old[0] != new[0] or old[1:3] != new[1:3]:
            return False
        if old[0] == "value" and not _same_expected(old[3], new[3]):
            return False
        if old[0] == "array" and old[2:] != new[2:]:
            return False
    return True


def _same_expected(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # a value whose == is not a plain truth value: not provably the same
        return False
