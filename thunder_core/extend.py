"""``thunder_core.extend``: the API for executor and transform-plugin authors.

Everything a plugin package may import from thunder_core is here, in ``thunder_core`` itself
(``jit``, ``explain``, ...) or in ``thunder_core.plugins`` (the hook markers and specs). The
rest of the package is internal and may change in any release; this surface changes only as
``CHANGELOG.md`` says, with a deprecation warning for one minor version before a name goes.

The surface is versioned with thunder-core itself (``API_VERSION``): declare the range you
were built for in your package's dependencies (``thunder-core>=0.2,<0.3``); a plugin installed
beside a thunder-core outside that range is listed as ``incompatible`` and never imported.

An operator executor in a few lines::

    import torch
    from thunder_core.extend import OperatorExecutor, Rejection, get_symbol
    from thunder_core.plugins import hookimpl

    @hookimpl
    def thunder_core_register_executor(register):
        executor = OperatorExecutor("myex")

        def float32_only(a, b, *, alpha=None):
            ok = all(x.dtype == torch.float32 for x in (a, b) if isinstance(x, torch.Tensor))
            return True if ok else Rejection("myex runs float32 only")

        executor.register_implementation(get_symbol("add"), my_add, checker=float32_only)
        register(executor)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from types import MappingProxyType

from thunder_core.autodiff.fallback import fallback_rule as _fallback_rule
from thunder_core.autodiff.registry import NoRule, register_vjp
from thunder_core.capture.symbolic import symbolic_examples
from thunder_core.disk_cache import DiskCache, job_disk_cache
from thunder_core.errors import CaptureError, ThunderCoreError
from thunder_core.executors.background import COMPILE_LOCK, on_compile_worker
from thunder_core.executors.base import (
    FusionExecutor,
    OperatorExecutor,
    Region,
    RegionNotSupported,
    Rejection,
    flatten_to_prims,
    has_symbolic_sizes,
)
from thunder_core.executors.in_place import overwrites as overwrites_in_place
from thunder_core.ir.proxies import NumberProxy, ObjectProxy, TensorProxy
from thunder_core.ir.symbolic import SymbolicSizeError, comparable_sizes
from thunder_core.ir.symbolic import hint as size_hint
from thunder_core.ir.symbols import (
    EFFECT,
    INPLACE,
    OPAQUE,
    RANDOM,
    RECOMPUTE,
    WHOLE,
    BoundSymbol,
    Symbol,
    active_recorder,
    free_inputs,
    is_impure,
)
from thunder_core.ir.trace import Trace, TrainingTraces
from thunder_core.ir.tree import leaves, tree_map
from thunder_core.jit.extension import ModuleExtension
from thunder_core.jit.fingerprint import region_fingerprint
from thunder_core.ops import prims as _prims
from thunder_core.ops.registry import TORCH_SYMBOLS as _TORCH_SYMBOLS
from thunder_core.ops.registry import lookup as _lookup
from thunder_core.ops.shapes import VIEW_OPS
from thunder_core.plugins.errors import ConfigError
from thunder_core.plugins.hookspecs import STAGES, Availability
from thunder_core.plugins.probes import availability, cuda_device, library
from thunder_core.transforms.autocast import DEVICE_TYPES as AUTOCAST_DEVICE_TYPES
from thunder_core.transforms.autocast import autocast_transform
from thunder_core.transforms.rematerialize import recompute_in_backward
from thunder_core.transforms.replay import replay

#: The version of this surface: thunder-core's own version (major.minor).
API_VERSION = "0.2"

__all__ = [
    "API_VERSION",
    "AUTOCAST_DEVICE_TYPES",
    "COMPILE_LOCK",
    "EFFECT",
    "INPLACE",
    "ModuleExtension",
    "OPAQUE",
    "RANDOM",
    "RECOMPUTE",
    "STAGES",
    "Availability",
    "BoundSymbol",
    "CaptureError",
    "ConfigError",
    "DiskCache",
    "FusionExecutor",
    "NoRule",
    "NumberProxy",
    "ObjectProxy",
    "OperatorExecutor",
    "Region",
    "RegionNotSupported",
    "Rejection",
    "Symbol",
    "SymbolicSizeError",
    "TensorProxy",
    "ThunderCoreError",
    "Trace",
    "TrainingTraces",
    "VIEW_OPS",
    "WHOLE",
    "autocast_transform",
    "autograd_fallback",
    "availability",
    "comparable_sizes",
    "cuda_device",
    "flatten_to_prims",
    "free_inputs",
    "is_impure",
    "job_disk_cache",
    "get_symbol",
    "has_symbolic_sizes",
    "leaves",
    "library",
    "new_object_proxy",
    "new_tensor_proxy",
    "on_compile_worker",
    "overwrites_in_place",
    "prim_symbols",
    "recompute_in_backward",
    "region_fingerprint",
    "register_vjp",
    "replay",
    "size_hint",
    "symbol_for",
    "symbolic_examples",
    "torch_symbols",
    "tree_map",
]


# Names that moved: old name -> (new name, the version that removes the old one).
_DEPRECATED = {"fallback_rule": ("autograd_fallback", "0.3")}


def __getattr__(name: str):
    if name in _DEPRECATED:
        new, removed_in = _DEPRECATED[name]
        warnings.warn(
            f"thunder_core.extend.{name} is deprecated and will be removed in thunder-core {removed_in}; "
            f"use thunder_core.extend.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module 'thunder_core.extend' has no attribute {name!r}")


def get_symbol(name: str) -> Symbol:
    """The symbol named ``name``: a torch-level op (``"add"``, ``"linear"``) or a prim (``"prims.add"``).

    Example: ``executor.register_supported(get_symbol("prims.exp"))``. Raises ``KeyError``
    listing a few known names when there is no such symbol.
    """
    if name.startswith("prims."):
        found = _prims.PRIMS.get(name.removeprefix("prims."))
        table = _prims.PRIMS
    else:
        found = _TORCH_SYMBOLS.get(name.removeprefix("torch."))
        table = _TORCH_SYMBOLS
    if found is None:
        prefix = "prims." if table is _prims.PRIMS else ""
        close = sorted(n for n in table if n.startswith(name.removeprefix("prims.")[:3]))[:8]
        raise KeyError(f"no thunder_core symbol named {name!r}; similar: {[prefix + n for n in close]}")
    return found


def symbol_for(torch_callable) -> Symbol | None:
    """The symbol capture records for a torch callable (``torch.add``, ``Tensor.view``), or None.

    Example: ``symbol_for(torch.nn.functional.gelu) is get_symbol("gelu")``.
    """
    entry = _lookup(torch_callable)
    return entry[0] if entry is not None else None


def torch_symbols() -> Mapping[str, Symbol]:
    """Every torch-level symbol by name (read-only), e.g. to claim all the ops you can run."""
    return MappingProxyType(_TORCH_SYMBOLS)


def prim_symbols() -> Mapping[str, Symbol]:
    """Every prim by name without the ``prims.`` prefix (read-only): what fusion executors generate code for."""
    return MappingProxyType(_prims.PRIMS)


def new_tensor_proxy(shape, dtype, device, requires_grad: bool = False, strides=None) -> TensorProxy:
    """A fresh proxy in the trace being recorded, for a hand-written ``meta`` of your own symbol.

    Example::

        def my_kernel_meta(q, k, v):
            return new_tensor_proxy(q.shape, q.dtype, q.device)

        my_kernel = Symbol("myex_attention", my_kernel_impl, "myex_attention", meta=my_kernel_meta)
    """
    recorder = active_recorder()
    if recorder is None:
        raise RuntimeError(
            "new_tensor_proxy is only valid while a trace is being recorded (inside a meta function)"
        )
    return recorder.new_proxy(shape, dtype, device, requires_grad, strides)


def new_object_proxy() -> ObjectProxy:
    """A fresh proxy for a non-tensor value (a pending collective's handle) in the trace being
    recorded, for the ``meta`` of a symbol that returns one."""
    recorder = active_recorder()
    if recorder is None:
        raise RuntimeError(
            "new_object_proxy is only valid while a trace is being recorded (inside a meta function)"
        )
    return ObjectProxy(recorder.namer("h"))


def autograd_fallback(symbol: Symbol):
    """A VJP rule that differentiates ``symbol`` with PyTorch autograd at run time.

    For an executor whose kernel has no backward of its own::

        executor.register_implementation(get_symbol("layer_norm"), fused_norm,
                                         grad=autograd_fallback(my_symbol))
    """
    return _fallback_rule(symbol)
