"""Differentiating an op that has no VJP rule with PyTorch autograd, at run time.

The forward runs the op under ``torch.enable_grad()`` on detached inputs and keeps the
small autograd graph in a handle; the backward calls ``torch.autograd.grad`` on it. So
training never fails for lack of a rule; the trace marks where this happened.
"""

from __future__ import annotations

import torch

from thunder_core.capture.meta import run_on_meta
from thunder_core.ir.proxies import ObjectProxy, TensorProxy
from thunder_core.ir.symbols import Symbol, active_recorder
from thunder_core.ir.tree import leaves, tree_map

AUTOGRAD_FALLBACK = "autograd_fallback"


def _differentiable(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad and (x.is_floating_point() or x.is_complex())


def _forward_impl(fn, args, kwargs):
    inputs = []

    def detach(x):
        if _differentiable(x):
            leaf = x.detach().requires_grad_()
            inputs.append(leaf)
            return leaf
        return x

    with torch.enable_grad():
        args, kwargs = tree_map(detach, args), tree_map(detach, kwargs)
        out = fn(*args, **kwargs)
    values = tree_map(lambda y: y.detach() if isinstance(y, torch.Tensor) else y, out)
    return values, (inputs, out)


def _backward_impl(handle, inputs, grads):
    leaf_inputs, out = handle
    pairs = [(o, g) for o, g in zip(leaves(out), grads) if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
    if not pairs:
        return tuple(None for _ in inputs)
    outs, gs = zip(*pairs)
    return torch.autograd.grad(outs, leaf_inputs, gs, allow_unused=True)


def _forward_meta(fn, args, kwargs):
    recorder = active_recorder()
    out = run_on_meta(fn, args, kwargs, recorder.new_proxy, inplace=False)
    return out, ObjectProxy(recorder.namer("h"))


def _backward_meta(handle, inputs, grads):
    recorder = active_recorder()
    return tuple(recorder.new_proxy(x.shape, x.dtype, x.device, False, x.stride()) for x in inputs)


fallback_forward = Symbol(
    name="autograd_fallback_forward",
    impl=_forward_impl,
    printed_name="autograd_fallback_forward",
    meta=_forward_meta,
    tags=frozenset({AUTOGRAD_FALLBACK}),
)
fallback_backward = Symbol(
    name="autograd_fallback_backward",
    impl=_backward_impl,
    printed_name="autograd_fallback_backward",
    meta=_backward_meta,
    tags=frozenset({AUTOGRAD_FALLBACK}),
)


def fallback_rule(symbol: Symbol):
    """A VJP rule that differentiates ``symbol.impl`` with PyTorch autograd at run time."""

    def rule(*args, **kwargs):
        out, handle = fallback_forward(symbol.impl, args, kwargs)
        inputs = tuple(x for x in leaves((args, kwargs)) if isinstance(x, TensorProxy) and x.requires_grad)

        def backward(grad):
            flat = grad if isinstance(grad, list) else [grad]
            grads = fallback_backward(handle, inputs, tuple(flat))
            return list(zip(inputs, grads))

        return out, backward

    return rule
