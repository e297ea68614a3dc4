"""thunder-core: a plugin-based source-to-source compiler for PyTorch programs.

``thunder_core.jit(fn_or_module)`` captures the program as a trace, transforms it, and
runs it as generated Python that calls the executors' implementations.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any, overload

from torch import nn

import thunder_core.ops  # noqa: F401  (registers the torch-level symbols)
from thunder_core._version import __version__
from thunder_core.disk_cache import DEFAULT_CACHE_DIR
from thunder_core.errors import CaptureError, DataDependentError, ThunderCoreError
from thunder_core.examine import Examination, examine
from thunder_core.executors.background import wait_for_compiles
from thunder_core.executors.base import FusionExecutor, OperatorExecutor, RegionNotSupported, Rejection
from thunder_core.explain import Explanation, explain
from thunder_core.functional import grad, grad_and_value, jvp, value_and_grad, vjp, vmap
from thunder_core.inspection import cache_info, last_backward_traces, last_blocks, last_traces
from thunder_core.ir import BoundSymbol, NumberProxy, Symbol, TensorProxy, Trace
from thunder_core.jit.function import DEFAULT_RECOMPILE_LIMIT, CacheInfo, ThunderFunction
from thunder_core.jit.module import ThunderModule, jit_method
from thunder_core.plugins.errors import ConfigError, PluginError
from thunder_core.report import report
from thunder_core.repro import ReproError, save_repro

__all__ = [
    "__version__",
    "BoundSymbol",
    "ConfigError",
    "Explanation",
    "FusionExecutor",
    "OperatorExecutor",
    "PluginError",
    "RegionNotSupported",
    "Rejection",
    "explain",
    "grad",
    "grad_and_value",
    "jvp",
    "value_and_grad",
    "vjp",
    "vmap",
    "Examination",
    "examine",
    "ReproError",
    "report",
    "save_repro",
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
    "last_blocks",
    "last_traces",
    "wait_for_compiles",
]


@overload
def jit(fn: nn.Module, **options) -> ThunderModule: ...
@overload
def jit(fn, **options) -> ThunderFunction: ...


def jit(
    fn,
    *,
    executors: Sequence[str] | None = None,
    plugins: Sequence[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    disable: Sequence[str] | None = None,
    select: str | None = None,
    compile_in_background: str | None = None,
    recompile_limit: int = DEFAULT_RECOMPILE_LIMIT,
    cache: str = "guarded",
    reuse_blocks: bool = True,
    dynamic: bool | None = None,
    capture_blocks_once: bool = False,
    cache_dir: str | os.PathLike | None = DEFAULT_CACHE_DIR,
    cache_traces: bool | None = None,
):
    """Compile a function of tensors, or an ``nn.Module`` (or a module's bound method:
    ``model.forward = thunder_core.jit(model.forward)`` is cached like ``jit(model)``).

    ``executors`` is the ordered list of executors that may claim operations (the torch
    executor always takes what is left); without it, every available installed executor
    is used in its declared priority. ``plugins`` enables transform plugins; ``options``
    maps executor/plugin names to their option values; ``disable`` names ones never to use.
    These override the environment (``THUNDER_CORE_*``) and the config file.

    ``select="measure"`` (the default) times each claim against the other executors that can
    run the same operations on the first call's real inputs and keeps the fastest (``explain``
    shows the timings); ``select="priority"`` keeps every claim as the claim order made it.

    ``compile_in_background="never"`` (the default) finishes every compile before the program
    runs, except that a program compiled again with fixed sizes compiles its fusion regions at
    its second call (its first runs their torch operations: a program run once, such as a
    generate's first decoding step, builds no kernels;
    ``THUNDER_CORE_RECOMPILED_REGIONS=at_once`` or the config file's ``recompiled_regions``
    turns that off). With ``"recompiles"``, when a function is compiled again (new sizes, a new
    signature), the new program runs at once, its fusion regions as plain torch operations
    while their executor (Inductor) compiles them on a worker thread, and each region switches
    to its compiled code when that is ready; ``"always"`` does the same for the first program
    (the fastest first result). ``thunder_core.wait_for_compiles()`` waits for the worker. While
    the worker compiles, a ``torch.compile``d function in the same process runs eagerly when it
    is called during an FX trace and compiles after the region (docs/plugins.md says why).

    The first call with a new input signature (shapes, dtypes, devices, requires_grad,
    grad mode, Python values) captures and compiles a trace; later calls with the same
    signature run the cached code, after checking that every Python value the trace was
    specialized on (globals, closure variables, module and config attributes, hooks, torch
    state) is unchanged; a change recompiles (``cache_info(jfn).reasons`` says what changed).
    ``cache="same input"`` skips those checks: only the inputs' metadata selects the compiled
    code, so a changed Python value is silently ignored — use it only when nothing changes.
    Arguments may also be lists, dicts and plain Python objects (dataclasses, Hugging Face
    ``Cache`` objects): their tensors are inputs, the rest is keyed by value, and what the
    function does to them (an attribute set, an item appended) is done to the caller's objects
    after each call, as eager does. After ``recompile_limit`` compilations, new signatures run eagerly and a warning says
    what kept changing.

    For a module, each call of a repeated block (a child of an ``nn.ModuleList`` or
    ``nn.Sequential`` whose class repeats, such as a transformer layer) is recorded as a
    block; calls that did the same operations on tensors of the same metadata are
    differentiated, claimed and compiled once and share the result. ``reuse_blocks=False``
    compiles every layer's operations separately. ``capture_blocks_once=True`` also skips
    running a layer's Python while capturing when its call would do what an earlier layer's
    call did (``docs/getting-started.md`` says what is compared, and what it cannot see).

    Sizes: the first call compiles for its inputs' sizes. With ``dynamic=None`` (the default),
    a later call whose tensors differ only in sizes compiles once more with the dimensions
    that changed symbolic (``s0`` in the printed trace), and that program serves every later
    size its size guards accept; ``dynamic=True`` makes every dimension of the arguments
    symbolic from the first call, ``dynamic=False`` compiles each new size.

    The executor choices measured by ``select="measure"`` are kept on disk for later processes on
    the same machine (``cache_dir``; by default ``THUNDER_CORE_CACHE_DIR``, the config file's
    ``cache_dir``, else thunder_core's folder in the user's cache directory; ``cache_dir=None``
    turns it off). With ``cache_traces=True`` (or ``THUNDER_CORE_CACHE_TRACES=1``) captured
    traces are kept too: a new process whose call, code and guarded Python values match a stored
    trace skips capturing (``cache_info(...).disk_hits``); off by default, because values a
    program gets from library calls (``os.getenv``, a memoized function) are not compared.
    """
    arguments = {"executors": executors, "plugins": plugins, "options": options, "disable": disable,
                 "select": select, "compile_in_background": compile_in_background, "recompile_limit": recompile_limit, "cache": cache, "reuse_blocks": reuse_blocks,
                 "dynamic": dynamic, "capture_blocks_once": capture_blocks_once, "cache_dir": cache_dir,
                 "cache_traces": cache_traces}  # fmt: skip
    if isinstance(fn, nn.Module):
        return ThunderModule.from_arguments(fn, arguments)
    if inspect.ismethod(fn) and isinstance(fn.__self__, nn.Module):  # model.forward = jit(model.forward)
        return jit_method(fn, arguments)
    if not callable(fn):
        raise TypeError(f"thunder_core.jit expects a function or an nn.Module, got {type(fn).__qualname__}")
    return ThunderFunction.from_arguments(fn, arguments)
