"""Module backward hooks (``register_full_backward_hook``, ``register_full_backward_pre_hook``).

Eager PyTorch runs a module's full backward hooks through ``torch.utils.hooks.BackwardHook``: an
identity autograd node on the module's inputs and one on its outputs. While a module with such
hooks is captured, those two points are recorded as the identity ops ``module_inputs_hooked``
and ``module_outputs_hooked`` of one ``HookSite``; their VJP rules call the hooks in the compiled
backward, as eager does: the pre-hooks on the gradients of the outputs (their result replaces
them), then the hooks on ``(module, grad_input, grad_output)`` (their result replaces the
gradients of the inputs). A program PyTorch autograd records whole runs the real
``BackwardHook`` instead.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.hooks import BackwardHook

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import EFFECT, Symbol, active_recorder


class HookSite:
    """One call of a module with backward hooks, as captured.

    ``inputs`` / ``outputs`` are the positional inputs and the outputs with ``None`` where a tensor
    was (what ``BackwardHook`` packs non-tensors as); ``input_index`` / ``output_index`` are the
    positions of the tensors (``input_index`` is None when no input needed a gradient).
    """

    def __init__(self, module, hooks, pre_hooks):
        self.module = module
        self.hooks = list(hooks)
        self.pre_hooks = list(pre_hooks)
        self.n_inputs = 0
        self.input_index: list[int] | None = None
        self.n_outputs = 0
        self.output_index: list[int] = []
        self.grad_outputs: tuple = ()  # while the backward trace is built: the outputs' gradients
        self.running: BackwardHook | None = None  # the real hook object, when autograd runs the program

    def __repr__(self) -> str:
        return f"HookSite({type(self.module).__qualname__})"

    # Run time, in the compiled backward.
    def call_pre_hooks(self, *grads):
        grad_outputs = _pack(self.output_index, grads, self.n_outputs)
        for hook in self.pre_hooks:
            result = hook(self.module, grad_outputs)
            if result is not None:
                if len(result) != len(grad_outputs):
                    raise RuntimeError(
                        "Backward pre hook returned an invalid number of grad_output, "
                        f"got {len(result)}, but expected {len(grad_outputs)}"
                    )
                grad_outputs = tuple(result)
        return tuple(grad_outputs[i] for i in self.output_index)

    def call_hooks(self, *grads):
        grad_input = _pack(self.input_index, grads[: len(self.input_index)], self.n_inputs)
        grad_output = _pack(self.output_index, grads[len(self.input_index) :], self.n_outputs)
        for hook in self.hooks:
            result = hook(self.module, grad_input, grad_output)
            if result is not None:
                if len(result) != len(grad_input):
                    raise RuntimeError(
                        "Backward hook returned an invalid number of grad_input, "
                        f"got {len(result)}, but expected {len(grad_input)}"
                    )
                grad_input = tuple(result)
        return tuple(grad_input[i] for i in self.input_index)

    def call_hooks_without_inputs(self, *grads):
        warnings.warn(
            "Full backward hook is firing when gradients are computed with respect to module outputs since "
            "no inputs require gradients.",
            stacklevel=2,
        )
        grad_output = _pack(self.output_index, grads, self.n_outputs)
        for hook in self.hooks:
            result = hook(self.module, (None,) * self.n_inputs, grad_output)
            if result is not None and not all(r is None for r in result):
                raise RuntimeError(
                    "Backward hook for Modules where no input requires gradient should always return None or "
                    "None for all gradients."
                )


def _pack(index, values, size) -> tuple:
    packed = [None] * size
    for i, value in zip(index, values):
        packed[i] = value
    return tuple(packed)


def _same_proxies(site, *xs):
    recorder = active_recorder()
    return tuple(
        recorder.new_proxy(x.shape, x.dtype, x.device, x.requires_grad, x.stride())
        if isinstance(x, TensorProxy)
        else x
        for x in xs
    )


def _gradients_like(site, *grads):
    recorder = active_recorder()
    return tuple(
        recorder.new_proxy(g.shape, g.dtype, g.device, False, g.stride())
        if isinstance(g, TensorProxy)
        else None
        for g in grads
    )


def _inputs_hooked(site: HookSite, *xs):
    """Run time: the inputs unchanged; under PyTorch autograd, eager's own BackwardHook on them."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        site.running = BackwardHook(site.module, site.hooks, site.pre_hooks)
        return tuple(site.running.setup_input_hook(xs))
    site.running = None
    return xs


def _outputs_hooked(site: HookSite, *xs):
    if site.running is not None:
        hooked, site.running = site.running.setup_output_hook(xs), None
        return tuple(hooked)
    return xs


def _inputs_vjp(site: HookSite, *xs):
    out = module_inputs_hooked(site, *xs)

    def backward(grads):
        grads = grads if isinstance(grads, (list, tuple)) else [grads]
        if not site.grad_outputs:  # no gradient came through the outputs: eager calls no hook either
            return list(zip(xs, grads))
        new = call_module_hooks(site, *grads, *site.grad_outputs)
        return list(zip(xs, new))

    return out, backward


def _outputs_vjp(site: HookSite, *xs):
    out = module_outputs_hooked(site, *xs)

    def backward(grads):
        grads = grads if isinstance(grads, (list, tuple)) else [grads]
        new = call_module_pre_hooks(site, *grads) if site.pre_hooks else tuple(grads)
        site.grad_outputs = tuple(new)
        if site.input_index is None:
            call_module_hooks_without_inputs(site, *new)
        return list(zip(xs, new))

    return out, backward


def _call_pre_hooks(site, *grads):
    return site.call_pre_hooks(*grads)


def _call_hooks(site, *grads):
    return site.call_hooks(*grads)


def _call_hooks_without_inputs(site, *grads):
    site.call_hooks_without_inputs(*grads)


def _nothing(site, *grads):
    return None


def _symbol(name, impl, meta, vjp=None) -> Symbol:
    return Symbol(name=name, impl=impl, printed_name=name, meta=meta, tags=frozenset({EFFECT}), vjp=vjp)


module_inputs_hooked = _symbol("module_inputs_hooked", _inputs_hooked, _same_proxies, _inputs_vjp)
module_outputs_hooked = _symbol("module_outputs_hooked", _outputs_hooked, _same_proxies, _outputs_vjp)
call_module_pre_hooks = _symbol("call_module_pre_hooks", _call_pre_hooks, _gradients_like)
call_module_hooks = _symbol(
    "call_module_hooks",
    _call_hooks,
    lambda site, *grads: _gradients_like(site, *grads[: len(site.input_index)]),
)
call_module_hooks_without_inputs = _symbol(
    "call_module_hooks_without_inputs", _call_hooks_without_inputs, _nothing
)
