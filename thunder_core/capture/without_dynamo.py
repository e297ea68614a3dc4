"""PyTorch's Python meta kernels, called without importing ``torch._dynamo``.

Capture and autodiff learn each operation's output metadata by running it on meta tensors.
Many of PyTorch's meta kernels are Python references (``torch._refs``) wrapped in
``torch._disable_dynamo``, whose wrapper imports ``torch._dynamo`` on its first call (about
1.4 s: sympy, the FX symbolic-shape machinery, the whole compiler front end) only to build a
function that switches Dynamo off around the kernel. A job that never uses Dynamo does not need
that: until ``torch._dynamo`` is imported no frame can be under Dynamo, so calling the kernel
directly is what the wrapper would do.

``python_meta_kernels_without_dynamo()`` gives each such wrapper, for the duration of the block
(from its first ``before_python_meta_kernels()``),
the function it caches on first use (its ``__dynamo_disable`` attribute): one that calls the
kernel directly while ``torch._dynamo`` is not loaded, and otherwise builds Dynamo's own wrapper
and caches it in its place, exactly as the first call would have. On leaving the block the
stand-ins that were not replaced are removed. If PyTorch's wrapper changes shape, nothing is
installed and the first meta kernel imports ``torch._dynamo`` as before.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from functools import cache
from types import FunctionType

import torch

_ATTRIBUTE = "__dynamo_disable"  # where torch._compile._disable_dynamo caches its wrapper
_lock = threading.Lock()
_depth = 0
_ready = False  # the open block's stand-ins are installed (or installing failed)
_installed: list[tuple[object, _CallDirectlyUntilDynamo]] = []


class _CallDirectlyUntilDynamo:
    __slots__ = ("fn", "recursive")

    def __init__(self, fn, recursive: bool):
        self.fn = fn
        self.recursive = recursive

    def __call__(self, *args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return self.fn(*args, **kwargs)
        import torch._dynamo

        disabled = torch._dynamo.disable(self.fn, self.recursive, wrapping=False)
        setattr(self.fn, _ATTRIBUTE, disabled)
        return disabled(*args, **kwargs)


def _wrapper_code():
    """The code object of ``_disable_dynamo``'s wrapper, or None if it is not a closure over
    ``fn`` and ``recursive`` as expected."""
    wrapper = torch._compile._disable_dynamo(lambda: None)
    code = getattr(wrapper, "__code__", None)
    if code is None or set(code.co_freevars) != {"fn", "recursive"}:
        return None
    return code


def _wrappers(code) -> list:
    """Every ``_disable_dynamo`` wrapper reachable from the registered decompositions and meta
    kernels and from ``torch._refs``, through ``__wrapped__`` and the functions a wrapper closes
    over (a reference's outer ``functools.wraps`` points past the wrappers inside it)."""
    import torch._decomp
    import torch._refs

    pending = []
    for table in torch._decomp.global_decomposition_table.values():
        pending.extend(table.values())
    pending.extend(torch._decomp.meta_table.values())
    for name in list(sys.modules):
        if name == "torch._refs" or name.startswith("torch._refs."):
            pending.extend(vars(sys.modules[name]).values())
    found, seen = [], set()
    while pending:
        fn = pending.pop()
        if not isinstance(fn, FunctionType) or id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn.__code__ is code:
            found.append(fn)
        pending.append(getattr(fn, "__wrapped__", None))
        for cell in fn.__closure__ or ():
            try:
                pending.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    return found


@cache
def _targets() -> tuple[tuple[object, bool], ...]:
    """``(fn, recursive)`` of each wrapper found (the tables are filled when torch is imported)."""
    code = _wrapper_code()
    if code is None:
        return ()
    targets = []
    for wrapper in _wrappers(code):
        cells = dict(zip(wrapper.__code__.co_freevars, (c.cell_contents for c in wrapper.__closure__)))
        targets.append((cells["fn"], cells["recursive"]))
    return tuple(targets)


def _install() -> None:
    for fn, recursive in _targets():
        if getattr(fn, _ATTRIBUTE, None) is None:
            stand_in = _CallDirectlyUntilDynamo(fn, recursive)
            setattr(fn, _ATTRIBUTE, stand_in)
            _installed.append((fn, stand_in))


def _remove() -> None:
    for fn, stand_in in _installed:
        if getattr(fn, _ATTRIBUTE, None) is stand_in:
            delattr(fn, _ATTRIBUTE)
    _installed.clear()


@contextmanager
def python_meta_kernels_without_dynamo():
    """Within the block, PyTorch's Python meta kernels run without importing ``torch._dynamo``
    (a no-op once it is imported). The stand-ins are installed by the block's first
    ``before_python_meta_kernels()``."""
    global _depth, _ready
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _remove()
                _ready = False


def before_python_meta_kernels() -> None:
    """Called right before PyTorch's meta kernels run: installs the stand-ins if a block is open
    and they are not yet. Finding the wrappers walks PyTorch's decomposition tables (10-20 ms
    once a process), which a capture whose operations need no meta kernel never pays."""
    global _ready
    if _ready or _depth == 0:
        return
    with _lock:
        if _ready or _depth == 0:
            return
        if "torch._dynamo" not in sys.modules:
            try:
                _install()
            except Exception:  # noqa: BLE001 - private PyTorch structure; without it only speed differs
                _remove()
        _ready = True  # after installing: a thread that reads it without the lock finds them in place
