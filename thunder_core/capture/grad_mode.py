"""Operations that eager runs with grad mode off, run with it off.

Proxies carry the grad mode their operation was recorded in (an output computed under
``torch.no_grad()`` does not require grad), and autodiff follows them. That is not enough where
the mode itself matters at run time:

- an in-place update under ``no_grad`` of a tensor that requires grad (an optimizer-like
  ``p.add_(g, alpha=-lr)``, an average of a weight): eager allows it on a leaf only with grad
  mode off, and autograd does not record it;
- a program that PyTorch autograd records as a whole (autodiff's fallback): an operation that
  ran under ``no_grad`` in eager would be recorded and change the gradient;
- a proxy's ``requires_grad`` can be out of date (``buf[0] = w`` makes ``buf`` need a gradient
  without returning it), so which operations ran under ``no_grad`` cannot be told from proxies.

So capture records each operation of a ``no_grad`` region inside a function called with grad
mode on as its ``without_grad`` variant: the same operation (same name, decomposition and
metadata), run by the torch executor under ``torch.no_grad()``, which autodiff leaves out of the
gradient. Executors claim a variant as they claim the operation (``Symbol.plain``), except an
in-place one: grad mode matters to how torch runs it, not to a fused kernel, and the program
PyTorch autograd records whole runs the torch executor alone. (A function called under
``no_grad`` records plain operations: the whole program runs with grad mode off.)
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from thunder_core.ir.symbols import EFFECT, NO_GRAD, PROGRAM, PYTHON, Symbol
from thunder_core.ops.registry import operator_schema

_variants: dict[Symbol, Symbol] = {}
_lock = threading.Lock()
_KEEP = frozenset({EFFECT, PROGRAM, PYTHON})  # hooks, block calls and bookkeeping stay as they are


class _UnderNoGrad:
    """``fn`` called under ``torch.no_grad()`` (its operator schema, if any, is ``fn``'s)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "fn")

    def __call__(self, *args, **kwargs):
        with torch.no_grad():
            return self.fn(*args, **kwargs)

    @property
    def _schema(self):
        return operator_schema(self.fn)


def without_grad(symbol: Symbol) -> Symbol:
    """``symbol`` run under ``torch.no_grad()``, printed ``no_grad(<symbol>)``."""
    if symbol.has_tag(NO_GRAD):
        return symbol
    with _lock:
        variant = _variants.get(symbol)
        if variant is None:
            variant = dataclasses.replace(
                symbol,
                impl=_UnderNoGrad(symbol.impl),
                printed_name=f"no_grad({symbol.printed_name})",
                tags=symbol.tags | {NO_GRAD},
                plain=symbol,
            )
            _variants[symbol] = variant
    return variant


def as_recorded(symbol: Symbol, grad_on_at_call: bool) -> Symbol:
    """The symbol capture records for a call of ``symbol`` now: its ``without_grad`` variant in a
    ``no_grad`` region of a function called with grad mode on."""
    if not grad_on_at_call or torch.is_grad_enabled() or symbol.impl is None or symbol.tags & _KEEP:
        return symbol
    return without_grad(symbol)
