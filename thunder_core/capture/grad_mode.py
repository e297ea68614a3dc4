"""Operations that eager runs with grad mode off, run with it off.

Proxies carry the grad mode their operation was recorded in (an output computed under
``torch.no_grad()`` does not require grad), which is all autodiff needs. Two things need the
mode itself at run time:

- An in-place update made under ``no_grad`` to a tensor that requires grad (an optimizer-like
  ``p.add_(g, alpha=-lr)``, an EMA of a parameter, a clamp of a weight): eager allows it on a
  leaf only with grad mode off, and autograd does not record it. Capture records it as the
  operation's ``without_grad`` variant, which runs under ``torch.no_grad()`` and which autodiff
  leaves out of the gradient, as autograd does.
- A program that PyTorch autograd records as a whole (autodiff's fallback): an operation that
  ran under ``no_grad`` in eager would otherwise be recorded by autograd and change the
  gradient. ``keep_grad_off`` gives every operation whose inputs require grad but whose outputs
  do not its ``without_grad`` variant.
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import NO_GRAD, Symbol
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ir.tree import leaves
from thunder_core.ops.registry import operator_schema

_variants: dict[Symbol, Symbol] = {}
_lock = threading.Lock()


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
                name=f"no_grad({symbol.name})",
                impl=_UnderNoGrad(symbol.impl),
                printed_name=f"no_grad({symbol.printed_name})",
                is_prim=False,
                decomposition=None,
                tags=symbol.tags | {NO_GRAD},
                vjp=None,
            )
            _variants[symbol] = variant
    return variant


def _tensors(tree) -> list[TensorProxy]:
    return [p for p in leaves(tree) if isinstance(p, TensorProxy)]


def updates_without_grad(inplace: bool, args: tuple, kwargs: dict) -> bool:
    """Whether an in-place call being recorded now is an update that grad mode off allows: grad
    mode is off and a tensor it is given requires grad."""
    return inplace and not torch.is_grad_enabled() and any(p.requires_grad for p in _tensors((args, kwargs)))


def keep_grad_off(trace: Trace) -> Trace:
    """``trace`` with every operation that computed outputs without grad from inputs that require
    it (it ran under ``no_grad``, or it is not differentiable) run under ``no_grad``: for a
    program that PyTorch autograd records whole."""
    changed = []
    for bsym in trace.bound_symbols:
        outputs = _tensors(bsym.output)
        if (
            outputs
            and not any(p.requires_grad for p in outputs)
            and any(p.requires_grad for p in _tensors((bsym.args, bsym.kwargs)))
            and bsym.symbol.impl is not None
        ):
            bsym = dataclasses.replace(bsym, symbol=without_grad(bsym.symbol), subsymbols=[])
        changed.append(bsym)
    if all(a is b for a, b in zip(changed, trace.bound_symbols)):
        return trace
    return trace.with_bound_symbols(changed, Provenance("grad mode off where eager had it off", 0.0))
