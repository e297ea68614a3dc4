"""Differentiating an op that has no VJP rule with PyTorch autograd, at run time.

The forward runs the op under ``torch.enable_grad()`` on detached inputs and keeps the
small autograd graph in a handle; the backward calls ``torch.autograd.grad`` on it. So
training never fails for lack of a rule; the trace marks where this happened.
"""

from __future__ import annotations

import torch

from thunder_core.capture.meta import run_on_meta
from thunder_core.errors import ThunderCoreError
from thunder_core.ir.proxies import ObjectProxy, TensorProxy
from thunder_core.ir.symbols import AUTOGRAD_FALLBACK, Symbol, active_recorder
from thunder_core.ir.tree import leaves, tree_map

__all__ = ["AUTOGRAD_FALLBACK", "fallback_backward", "fallback_forward", "fallback_rule"]


def _forward_impl(fn, args, kwargs, differentiable):
    """``differentiable[i]`` says whether the i-th leaf of (args, kwargs) gets a gradient.

    It is decided when the trace is made: inside the compiled forward no tensor requires
    grad at run time.
    """
    inputs = []
    flags = iter(differentiable)

    def detach(x):
        if next(flags) and isinstance(x, torch.Tensor):
            leaf = x.detach().requires_grad_()
            inputs.append(leaf)
            return leaf
        return x

    with torch.enable_grad():
        args, kwargs = tree_map(detach, args), tree_map(detach, kwargs)
        out = fn(*args, **kwargs)
    values = tree_map(lambda y: y.detach() if isinstance(y, torch.Tensor) else y, out)
    return values, _Graph(inputs, out)


class _Graph:
    """The handle: the detached inputs and the outputs of one run, with autograd's graph between
    them (one object, so tree walks over a call's arguments see it as one value)."""

    __slots__ = ("inputs", "out")

    def __init__(self, inputs: list, out):
        self.inputs, self.out = inputs, out


def _backward_impl(handle, inputs, grads):
    leaf_inputs, out = handle.inputs, handle.out
    pairs = [
        (o, g)
        for o, g in zip(leaves(out), grads)
        if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
    ]
    if not pairs:
        return tuple(torch.zeros_like(x) for x in leaf_inputs)
    outs, gs = zip(*pairs)
    # Differentiated again with respect to the incoming gradients (a functional transform's
    # jvp, which transposes this linear map): keep the graph from them to the result.
    again = torch.is_grad_enabled() and any(g.requires_grad for g in gs)
    try:
        if again:
            grads = torch.autograd.grad(outs, leaf_inputs, gs, allow_unused=True, create_graph=True)
        else:
            # backward, not grad: a reentrant checkpoint (an autograd Function) refuses .grad().
            # The gradients of this call's detached inputs are read off their .grad; leaves the op
            # reaches itself (a checkpointed layer's parameters) accumulate theirs, as in eager.
            torch.autograd.backward(outs, gs)
            grads = [x.grad for x in leaf_inputs]
    except NotImplementedError:
        # PyTorch has no derivative for the op ("the derivative for 'igamma: input' is not
        # implemented"): eager never runs it when the loss does not use the op's outputs, and
        # here those receive zeros, which give zeros (a gradient is linear in them).
        if not all(g.count_nonzero() == 0 for g in gs):
            raise
        grads = [None] * len(leaf_inputs)
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaf_inputs))


def _forward_meta(fn, args, kwargs, differentiable):
    recorder = active_recorder()
    if (
        fn is _backward_impl
    ):  # the backward of another fallback, differentiated again: its handle is no tensor
        out = _backward_meta(*args, **kwargs)
    else:
        out = run_on_meta(fn, args, kwargs, recorder.new_proxy, inplace=False)
    return out, ObjectProxy(recorder.namer("h"))


def _backward_meta(handle, inputs, grads):
    recorder = active_recorder()
    # Needs a gradient when the incoming gradients or the inputs do: differentiated again, it is
    # linear in the gradients (a functional transform's jvp); the inputs' second derivatives are
    # refused by ``fallback_rule``, never silently zero.
    again = torch.is_grad_enabled() and any(
        isinstance(x, TensorProxy) and x.requires_grad for x in (*grads, *inputs)
    )
    return tuple(recorder.new_proxy(x.shape, x.dtype, x.device, again, x.stride()) for x in inputs)


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
        if symbol is fallback_backward and any(
            isinstance(x, TensorProxy) and x.requires_grad for x in leaves(args[1])
        ):
            raise ThunderCoreError(
                "thunder_core: an operation without a VJP rule of thunder_core's (its gradient is PyTorch "
                "autograd's, at run time) is differentiated twice with respect to its inputs (grad of grad, "
                "or a gradient inside a training step); that needs a VJP rule of its own. Use torch.func for "
                "this function, or leave it un-jitted."
            )
        flat = list(leaves((args, kwargs)))
        differentiable = tuple(isinstance(x, TensorProxy) and x.requires_grad for x in flat)
        out, handle = fallback_forward(symbol.impl, args, kwargs, differentiable)
        inputs = tuple(x for x, d in zip(flat, differentiable) if d)

        def backward(grad):
            flat = grad if isinstance(grad, list) else [grad]
            grads = fallback_backward(handle, inputs, tuple(flat))
            return list(zip(inputs, grads))

        return out, backward

    return rule
