"""``ThunderFunction``: a jitted callable with its cache of compiled traces."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, NamedTuple

import torch

from thunder_core.jit.cache_key import add_to_key, describe
from thunder_core.jit.pipeline import Compiled, compile_function

Tensor = torch.Tensor
_is_grad_enabled = torch.is_grad_enabled

DEFAULT_RECOMPILE_LIMIT = 8


class CacheInfo(NamedTuple):
    """Cache statistics of one jitted function."""

    hits: int
    misses: int
    entries: int


def _positional_names(fn) -> list[str]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    names = []
    for p in signature.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return names


class ThunderFunction:
    """A function compiled by ``thunder_core.jit``; call it like the original."""

    def __init__(self, fn, *, recompile_limit: int = DEFAULT_RECOMPILE_LIMIT, state=None, job=None):
        self._fn = fn
        self._job = job
        self._recompile_limit = recompile_limit
        self._state = state  # for modules: supplies parameters and buffers as extra inputs
        self._cache: dict[tuple, Any] = {}
        self._compiled: dict[tuple, Compiled] = {}
        self._descriptions: list[dict[str, str]] = []
        self._names = _positional_names(fn)
        self._hits = 0
        self._misses = 0
        self._last_key = None
        self._warned = False
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, **kwargs):
        # The hot path: a key from the inputs' metadata, one dict lookup, one call.
        key = [_is_grad_enabled()]
        if not kwargs and self._state is None:
            for a in args:
                if not isinstance(a, Tensor):
                    break
                key.append(a.shape)
                key.append(a.dtype)
                key.append(a.device)
                key.append(a.requires_grad)
            else:
                key = tuple(key)
                entry = self._cache.get(key)
                if entry is not None:
                    self._hits += 1
                    self._last_key = key
                    return entry(*args)
                return self._miss(key, args, args, kwargs)
            key = [key[0]]
        leaves: list = []
        key.append(len(args))
        names = self._names
        for i, a in enumerate(args):
            add_to_key(a, key, leaves, names[i] if i < len(names) else f"args[{i}]")
        if kwargs:
            key.append(tuple(kwargs))
            for name, value in kwargs.items():
                add_to_key(value, key, leaves, name)
        if self._state is not None:
            key.append(self._state.key())
            for t in self._state.tensors():
                add_to_key(t, key, leaves, "state")
        key = tuple(key)
        entry = self._cache.get(key)
        if entry is not None:
            self._hits += 1
            self._last_key = key
            return entry(*leaves)
        return self._miss(key, leaves, args, kwargs)

    def _describe(self, args, kwargs) -> dict[str, str]:
        out = {"grad mode": "enabled" if torch.is_grad_enabled() else "disabled"}
        for i, a in enumerate(args):
            describe(a, self._names[i] if i < len(self._names) else f"args[{i}]", out)
        for k, v in kwargs.items():
            describe(v, k, out)
        if self._state is not None:
            out.update(self._state.describe())
        return out

    def _miss(self, key, leaves, args, kwargs):
        self._misses += 1
        description = self._describe(args, kwargs)
        if len(self._compiled) >= self._recompile_limit:
            self._warn_recompiles(description)
            return self._fn(*args, **kwargs)
        extra_inputs = self._state.named_tensors() if self._state is not None else ()
        binder = self._state.binder if self._state is not None else None
        compiled = compile_function(
            self._fn,
            args,
            kwargs,
            positional_names=self._names,
            extra_inputs=extra_inputs,
            extra_binder=binder,
            job=self._job,
        )
        self._compiled[key] = compiled
        self._cache[key] = compiled.callable
        self._descriptions.append(description)
        self._last_key = key
        return compiled.callable(*leaves)

    def _warn_recompiles(self, description: dict[str, str]) -> None:
        if self._warned:
            return
        self._warned = True
        changes = []
        for old in self._descriptions[-3:]:
            for path in sorted(set(old) | set(description)):
                if old.get(path) != description.get(path):
                    changes.append(
                        f"  {path}: {old.get(path, '(absent)')} -> {description.get(path, '(absent)')}"
                    )
        changed = "\n".join(dict.fromkeys(changes)) or "  (nothing visible in the arguments)"
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        warnings.warn(
            f"thunder_core.jit: {name} was compiled {len(self._compiled)} times (recompile_limit="
            f"{self._recompile_limit}); new input signatures now run eagerly, uncompiled. What kept "
            f"changing:\n{changed}\nKeep these stable, or raise recompile_limit in thunder_core.jit(...).",
            stacklevel=3,
        )

    # Inspection.
    def cache_info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, len(self._compiled))

    def last_compiled(self) -> Compiled | None:
        if self._last_key is None:
            return None
        return self._compiled.get(self._last_key)
