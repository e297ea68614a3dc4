"""thunder-core: a plugin-based source-to-source compiler for PyTorch programs.

``thunder_core.jit(fn_or_module)`` captures the program as a trace, transforms it, and
runs it as generated Python that calls the executors' implementations.
"""

from __future__ import annotations

from typing import overload

from torch import nn

import thunder_core.ops  # noqa: F401  (registers the torch-level symbols)
from thunder_core.errors import CaptureError, DataDependentError, ThunderCoreError
from thunder_core.inspection import cache_info, last_backward_traces, last_traces
from thunder_core.ir import BoundSymbol, NumberProxy, Symbol, TensorProxy, Trace
from thunder_core.jit.function import DEFAULT_RECOMPILE_LIMIT, CacheInfo, ThunderFunction
from thunder_core.jit.module import ThunderModule

__version__ = "0.1.0"

__all__ = [
    "BoundSymbol",
    "CacheInfo",
    "CaptureError",
    "DataDependentError",
    "NumberProxy",
    "Symbol",
    "TensorProxy",
    "ThunderCoreError",
    "ThunderFunction",
    "ThunderModule",
    "Trace",
    "cache_info",
    "jit",
    "last_backward_traces",
    "last_traces",
]


@overload
def jit(fn: nn.Module, *, recompile_limit: int = ...) -> ThunderModule: ...
@overload
def jit(fn, *, recompile_limit: int = ...) -> ThunderFunction: ...


def jit(fn, *, recompile_limit: int = DEFAULT_RECOMPILE_LIMIT):
    """Compile a function of tensors, or an ``nn.Module``.

    The first call with a new input signature (shapes, dtypes, devices, requires_grad,
    grad mode, Python values) captures and compiles a trace; later calls with the same
    signature run the cached code. After ``recompile_limit`` signatures, new ones run
    eagerly and a warning says what kept changing.
    """
    if isinstance(fn, nn.Module):
        return ThunderModule(fn, recompile_limit=recompile_limit)
    if not callable(fn):
        raise TypeError(f"thunder_core.jit expects a function or an nn.Module, got {type(fn).__qualname__}")
    return ThunderFunction(fn, recompile_limit=recompile_limit)
