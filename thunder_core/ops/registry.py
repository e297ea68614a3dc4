"""The table from torch callables to thunder_core symbols.

``register_torch_op`` makes a torch-level symbol whose ``impl`` is the torch callable
itself (so the torch executor runs exactly what eager PyTorch runs) and maps that
callable and its aliases (``Tensor`` methods, operators) to it.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable

import torch

from thunder_core.ir.symbols import INPLACE, OPAQUE, RANDOM, Symbol

Adapter = Callable[[tuple, dict], tuple[tuple, dict]]

_TORCH_TABLE: dict[object, tuple[Symbol, Adapter | None]] = {}
TORCH_SYMBOLS: dict[str, Symbol] = {}
_OPAQUE_SYMBOLS: dict[object, Symbol] = {}
_PATHS: dict[object, str] | None = None

_NAMESPACES = (
    ("torch.nn.functional", torch.nn.functional),
    ("torch.special", torch.special),
    ("torch.linalg", torch.linalg),
    ("torch.fft", torch.fft),
    ("torch.Tensor", torch.Tensor),
    ("torch", torch),
)


def _torch_paths() -> dict[object, str]:
    """Reverse lookup from torch callables to a public dotted path that reaches them."""
    global _PATHS
    if _PATHS is None:
        paths: dict[object, str] = {}
        for prefix, namespace in reversed(_NAMESPACES):
            for attr in dir(namespace):
                try:
                    obj = getattr(namespace, attr)
                except Exception:
                    continue
                if isinstance(obj, (types.ModuleType, type)) or not callable(obj):
                    if prefix == "torch.Tensor" and hasattr(obj, "__get__") and not callable(obj):
                        try:
                            paths[obj.__get__] = f"{prefix}.{attr}.__get__"
                        except Exception:
                            pass
                    continue
                try:
                    paths[obj] = f"{prefix}.{attr}"
                except TypeError:  # unhashable
                    pass
        _PATHS = paths
    return _PATHS


def torch_path(fn) -> str | None:
    """``torch.nn.functional.gelu`` -> ``"torch.nn.functional.gelu"``; None if not public."""
    try:
        return _torch_paths().get(fn)
    except TypeError:
        return None


def register_torch_op(
    name: str,
    impl: Callable,
    *aliases: Callable | tuple[Callable, Adapter],
    decomposition: Callable | None = None,
    meta: Callable | None = None,
    tags: Iterable[str] = (),
) -> Symbol:
    """Register a torch-level symbol for ``impl`` and the callables that mean the same."""
    printed = torch_path(impl) or f"torch_op_{name}"
    symbol = Symbol(
        name=name,
        impl=impl,
        printed_name=printed,
        decomposition=decomposition,
        meta=meta,
        tags=frozenset(tags),
    )
    TORCH_SYMBOLS[name] = symbol
    for entry in (impl, *aliases):
        fn, adapter = entry if isinstance(entry, tuple) else (entry, None)
        _TORCH_TABLE[fn] = (symbol, adapter)
    return symbol


def lookup(fn) -> tuple[Symbol, Adapter | None] | None:
    """The symbol registered for a torch callable, with its argument adapter."""
    try:
        return _TORCH_TABLE.get(fn)
    except TypeError:
        return None


def _is_inplace(fn, kwargs) -> bool:
    name = getattr(fn, "__name__", "")
    if name in ("__setitem__",) or (name.startswith("__i") and name.endswith("__") and name != "__index__"):
        return True
    if name.endswith("_") and not name.endswith("__"):
        return True
    return kwargs.get("out") is not None or _schema_mutates(fn)


def operator_schema(fn):
    """The operator schema of a torch callable (an OpOverload, or an OpOverloadPacket called as
    is, which runs its default overload); None for callables without one (Python functions,
    ``torch.Tensor`` methods)."""
    try:
        schema = getattr(fn, "_schema", None)
        if schema is None:
            schema = getattr(getattr(fn, "default", None), "_schema", None)
    except (AttributeError, RuntimeError, TypeError):
        return None
    return schema


def _schema_mutates(fn) -> bool:
    """Whether an operator's schema says it writes to an argument (``Tensor(a!)``): custom ops
    declared with ``torch.library.custom_op(..., mutates_args=...)`` and ATen's mutating ops,
    whatever their names."""
    schema = operator_schema(fn)
    return schema is not None and bool(schema.is_mutable)


# Torch callables without a symbol of their own that draw random numbers: recorded as opaque calls
# tagged RANDOM, so no pass drops or duplicates their draws (the generator's stream stays eager's).
RANDOM_NAMES = frozenset(
    {"normal", "poisson", "multinomial", "binomial", "_standard_gamma", "_sample_dirichlet", "rrelu",
     "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_dropout",
     "feature_alpha_dropout", "native_dropout", "gumbel_softmax", "fused_dropout", "_fused_dropout"}
)  # fmt: skip


_RANDOM_INPLACE_NAMES = frozenset(
    {"uniform_", "normal_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "bernoulli_"}
)


def draws_random_numbers(fn) -> bool:
    """Whether calling the torch callable ``fn`` draws from a random number generator."""
    entry = lookup(fn)
    if entry is not None and entry[0].has_tag(RANDOM):
        return True
    name = getattr(fn, "__name__", fn if isinstance(fn, str) else "")
    return name in RANDOM_NAMES or name in _RANDOM_INPLACE_NAMES


def opaque_symbol(fn, kwargs) -> Symbol:
    """The symbol that records a call to a torch callable thunder_core has no symbol for."""
    inplace = _is_inplace(fn, kwargs)
    key = (fn, inplace)
    try:
        symbol = _OPAQUE_SYMBOLS.get(key)
    except TypeError:
        key, symbol = None, None
    if symbol is None:
        path = torch_path(fn)
        name = path or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
        tags = {OPAQUE} | ({INPLACE} if inplace else set())
        if getattr(fn, "__name__", "") in RANDOM_NAMES:
            tags.add(RANDOM)
        symbol = Symbol(name=name, impl=fn, printed_name=path or f"opaque_{name}", tags=frozenset(tags))
        if key is not None:
            _OPAQUE_SYMBOLS[key] = symbol
    return symbol


def swap_first_two(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Adapter for reflected operators: ``Tensor.__radd__(x, 2)`` means ``torch.add(2, x)``."""
    return (args[1], args[0], *args[2:]), kwargs
