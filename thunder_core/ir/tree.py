"""Walking the nested tuple/list/dict structures that appear in op arguments and outputs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def leaves(tree: Any) -> Iterator[Any]:
    """Yield every leaf of nested tuples, lists and dicts (dict values in insertion order)."""
    if isinstance(tree, (tuple, list)):
        for item in tree:
            yield from leaves(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from leaves(item)
    else:
        yield tree


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf, rebuilding tuples (named ones too), lists and dicts."""
    if isinstance(tree, list):
        return [tree_map(fn, item) for item in tree]
    if isinstance(tree, tuple):
        mapped = [tree_map(fn, item) for item in tree]
        if type(tree) is tuple:
            return tuple(mapped)
        if hasattr(tree, "_fields"):  # namedtuple
            return type(tree)(*mapped)
        return type(tree)(mapped)  # torch.return_types structseq
    if isinstance(tree, dict):
        return type(tree)((key, tree_map(fn, value)) for key, value in tree.items())
    return fn(tree)
