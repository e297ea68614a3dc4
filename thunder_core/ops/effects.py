"""Torch calls made for their effect, not a tensor: gradient hooks and ``retain_grad``.

``t.register_hook(fn)`` and ``t.retain_grad()`` are recorded as ``EFFECT`` bound symbols (never
dead code) and replayed where eager has them act:

- on a tensor the trace takes as input (an argument, a parameter), the call runs at run time on
  the real tensor, exactly as eager makes it (the hook stays registered on that tensor);
- on a tensor computed inside, autodiff calls the hook on that tensor's gradient in the compiled
  backward (``call_gradient_hook``), when the gradient is complete, and uses what it returns;
  ``retain_grad`` of a returned tensor fills that tensor's ``.grad`` with the complete gradient
  (``RetainedGrad``), as eager's ``retain_grad`` does.

A hook that uses a tensor computed inside the function (a closure over an intermediate) is
refused: at run time that tensor does not exist outside the trace. ``backward()`` inside a
jitted function is refused with the way out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from torch.utils.hooks import RemovableHandle

from thunder_core.errors import CaptureError
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.source import user_location
from thunder_core.ir.symbols import EFFECT, Symbol, active_recorder
from thunder_core.ir.tree import leaves
from thunder_core.ops.registry import register_torch_op

T = torch.Tensor


def _place() -> str:
    where = user_location()
    return f"{where.filename}:{where.lineno}: `{where.line}`" if where else "the captured function"


class CapturedHookHandle(RemovableHandle):
    """The handle ``register_hook`` returns while capturing: the hook is registered on every call."""

    def remove(self) -> None:
        raise CaptureError(
            f"{_place()}: removes a gradient hook registered inside a jitted function. The trace registers it on "
            "every call, so removing the handle kept from one call would not remove the others. Ways out: "
            "register the hook outside the jitted function (on the input or parameter), or keep the decision "
            "inside the hook (return None to leave the gradient unchanged)."
        )


def _proxies_in(value, depth: int = 0) -> list[TensorProxy]:
    if isinstance(value, TensorProxy):
        return [value]
    if depth < 3 and isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return [p for item in items for p in _proxies_in(item, depth + 1)]
    return []


def _refuse_captured_tensors(fn) -> None:
    """A hook that reads a traced tensor (through its closure, defaults or ``self``) cannot run later."""
    target = getattr(fn, "__func__", fn)
    values = [cell.cell_contents for cell in getattr(target, "__closure__", None) or () if _filled(cell)]
    values += list(getattr(target, "__defaults__", None) or ())
    values += list(getattr(fn, "args", ()))  # functools.partial
    found = [p for v in values for p in _proxies_in(v)]
    if found:
        raise CaptureError(
            f"{_place()}: registers a gradient hook that uses {found[0].name}, a tensor computed inside the "
            "jitted function. The hook runs during backward, when that value exists only inside the compiled "
            "trace. Ways out: compute what the hook needs from the gradient alone, pass it in as an input, "
            "or register the hook outside the jitted function."
        )


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _register_hook_meta(tensor, hook):
    if not tensor.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if not callable(hook):
        raise TypeError(f"register_hook expects a callable, got {type(hook).__qualname__}")
    _refuse_captured_tensors(hook)
    return CapturedHookHandle(OrderedDict())


def _retain_grad_meta(tensor):
    if not tensor.requires_grad:
        raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
    return None


def _register_hook(tensor, hook):
    """Run time: the hook on the real tensor (a trace input), as eager registers it."""
    tensor.register_hook(hook)


def _retain_grad(tensor):
    tensor.retain_grad()


register_hook = register_torch_op(
    "register_hook", _register_hook, T.register_hook, meta=_register_hook_meta, tags=(EFFECT,)
)
retain_grad = register_torch_op(
    "retain_grad", _retain_grad, T.retain_grad, meta=_retain_grad_meta, tags=(EFFECT,)
)
register_hook.printed_name = "torch.Tensor.register_hook"
retain_grad.printed_name = "torch.Tensor.retain_grad"


def _call_gradient_hook(hook, grad):
    """Run time: ``hook(grad)``; what it returns replaces the gradient (None keeps it)."""
    result = hook(grad)
    return grad if result is None else result


def _call_gradient_hook_meta(hook, grad):
    recorder = active_recorder()
    return recorder.new_proxy(grad.shape, grad.dtype, grad.device, False, grad.stride())


class _RunningBackward(threading.local):
    outputs: dict | None = None  # flat output position -> weak reference to the tensor the caller got


running_backward = _RunningBackward()


class RetainedGrad:
    """The hook ``retain_grad()`` of a returned intermediate becomes: the complete gradient of that
    value (computed inside the compiled backward) is accumulated into ``.grad`` of the output
    tensor the caller received from this call, as eager's ``retain_grad`` does."""

    def __init__(self, position: int):
        self.position = position

    def __call__(self, grad):
        outputs = running_backward.outputs or {}
        ref = outputs.get(self.position)
        tensor = ref() if ref is not None else None
        if tensor is not None:
            tensor.grad = grad.detach().clone() if tensor.grad is None else tensor.grad + grad.detach()
        return None

    def __repr__(self) -> str:
        return f"RetainedGrad(output {self.position})"


call_gradient_hook = Symbol(
    name="call_gradient_hook",
    impl=_call_gradient_hook,
    printed_name="call_gradient_hook",
    meta=_call_gradient_hook_meta,
    tags=frozenset({EFFECT}),
)


def _refuse_backward(*args, **kwargs):
    raise CaptureError(
        f"{_place()}: calls backward inside a jitted function. thunder_core differentiates the program it "
        "captures itself: jit the forward (the model, or a function returning the loss) and call .backward() "
        "on its result outside, e.g. loss = thunder_core.jit(loss_fn)(model, batch); loss.backward()."
    )


def _backward_meta(*args, **kwargs):
    if any(isinstance(x, TensorProxy) for x in leaves((args, kwargs))):
        _refuse_backward()
    return torch.autograd.backward(*args, **kwargs)


register_torch_op("backward", torch.autograd.backward, T.backward, meta=_backward_meta, tags=(EFFECT,))
