"""How the user's Python sees the symbolic sizes and ints of a capture: as eager's ints.

In a capture with symbolic sizes, ``x.shape[0]`` and an int argument taken symbolic are
``torch.SymInt``s. Arithmetic and comparisons on them are recorded (a comparison becomes a guard
of the program), but two Python operations would quietly answer for every value alike:

- ``isinstance(n, int)`` is False for a ``SymInt``, so a program that takes another path for a
  non-int (Hugging Face's ``logits_to_keep``: a slice for an int, an index tensor otherwise)
  would take the wrong one. While a symbolic capture runs, ``builtins.isinstance`` answers for
  a SymInt (SymFloat, SymBool) of that capture as it would for an int (float, bool) when called
  from the user's code; torch's and thunder-core's own code, and the fake kernels that capture
  runs an operation's metadata through (``kernels_running``), which tell symbolic sizes from
  ints on purpose, get the builtin's answer. (``type(n) is int`` is not covered.)
- ``str(n)``, ``repr(n)``, ``f"{n}"`` would be the symbol's name (``s0``): they give the value
  for this call, and the program is specialized on it, as any use of the value is.

Both apply only to symbolic values of the capture running in the calling context; other threads
and other ``ShapeEnv``s (a ``torch.compile`` running beside) see PyTorch's behaviour. The
builtin is replaced only while a symbolic capture runs, and put back when the last one ends.
"""

from __future__ import annotations

import builtins
import contextvars
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager

import torch

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_EAGER_TYPE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}
_STAND_IN = {torch.SymInt: 2, torch.SymFloat: 0.5, torch.SymBool: True}  # isinstance ignores the value
_LIBRARIES = ("torch.", "thunder_core.", "thunder_executor_", "thunder_plugin_", "sympy.", "functorch.")
_TEXT_METHODS = ("__str__", "__repr__", "__format__")

_builtin_isinstance = builtins.isinstance
_lock = threading.Lock()
_captures = 0
_text_installed = False
_is_ours: Callable[[object], bool] = lambda value: False  # noqa: E731 - set by ``as_eager_values``
_in_kernels: contextvars.ContextVar[bool] = contextvars.ContextVar("in_kernels", default=False)


@contextmanager
def kernels_running():
    """Around operations' fake and meta kernels run by capture: they see symbolic values as they are."""
    token = _in_kernels.set(True)
    try:
        yield
    finally:
        _in_kernels.reset(token)


def _from_a_library(frame) -> bool:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "torch" or name.startswith(_LIBRARIES)


def _isinstance(obj, classinfo, /) -> bool:
    kind = type(obj)
    if (
        kind in _EAGER_TYPE
        and _is_ours(obj)
        and not _in_kernels.get()
        and not _from_a_library(sys._getframe(1))
    ):
        return _builtin_isinstance(_STAND_IN[kind], classinfo)
    return _builtin_isinstance(obj, classinfo)


def _text(kind: type, name: str):
    original = getattr(kind, name)
    concrete = _EAGER_TYPE[kind]

    def method(self, *args):
        if _is_ours(self):
            return getattr(concrete(self), name)(*args)  # the value for this call, guarded
        return original(self, *args)

    method.__name__, method.__qualname__ = name, f"{kind.__name__}.{name}"
    return method


@contextmanager
def as_eager_values(is_ours: Callable[[object], bool]):
    """While a symbolic capture runs: ``isinstance`` and printing treat ``is_ours`` values (the
    running capture's symbolic sizes and ints) as eager's ints, floats and bools."""
    global _captures, _text_installed, _is_ours
    with _lock:
        if not _text_installed:  # permanent, and inert outside a capture (``is_ours`` says so)
            for kind in _SYMBOLIC:
                for name in _TEXT_METHODS:
                    setattr(kind, name, _text(kind, name))
            _text_installed = True
        _is_ours = is_ours
        if _captures == 0:
            builtins.isinstance = _isinstance
        _captures += 1
    try:
        yield
    finally:
        with _lock:
            _captures -= 1
            if _captures == 0:
                builtins.isinstance = _builtin_isinstance
