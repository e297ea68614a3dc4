"""``torch.autograd.Function`` subclasses in captured code: recorded whole, differentiated as written.

A custom Function's ``apply`` is not a torch function, so the capture mode never sees it:
without help, capture would record the ops of its ``forward`` and autodiff would differentiate
them, silently replacing the user's ``backward``. While capturing, ``Function.apply`` is
intercepted: a call on traced tensors becomes one opaque operation ``<Class>.apply`` that
runs the user's forward at run time, and autodiff differentiates it with PyTorch autograd
(the autograd fallback), which calls the user's ``backward`` exactly as written.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import OPAQUE, Symbol, active_recorder
from thunder_core.ir.tree import leaves

_Function = torch.autograd.Function
_original_apply = _Function.__dict__["apply"]  # a classmethod
_symbols: dict[type, Symbol] = {}


def _symbol_for(cls: type) -> Symbol:
    symbol = _symbols.get(cls)
    if symbol is None:

        def apply(*args, **kwargs):
            return cls.apply(*args, **kwargs)

        apply.reads_tensors_it_is_not_given = True  # its forward may read a module's parameter itself

        name = f"{cls.__qualname__}.apply"
        apply.__name__ = apply.__qualname__ = name
        symbol = _symbols[cls] = Symbol(name=name, impl=apply, printed_name=name, tags=frozenset({OPAQUE}))
    return symbol


def _intercepted_apply(cls, *args, **kwargs):
    if active_recorder() is None or not any(isinstance(x, TensorProxy) for x in leaves((args, kwargs))):
        return _original_apply.__func__(cls, *args, **kwargs)
    with torch._C.DisableTorchFunction():
        return _symbol_for(cls)(*args, **kwargs)


_lock = threading.Lock()
_active = 0  # captures in progress (in any thread): the patch stays while one is


@contextmanager
def autograd_functions_recorded_whole():
    """Within the block, ``Function.apply`` on traced tensors records one opaque operation.

    The interception checks the calling thread's recorder, so other threads' eager calls pass
    through; it is installed while any capture is in progress.
    """
    global _active
    with _lock:
        _active += 1
        _Function.apply = classmethod(_intercepted_apply)
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                _Function.apply = _original_apply
