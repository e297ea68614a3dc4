"""Modules with full backward hooks, while captured: their hook points are recorded as ops.

``nn.Module.__call__`` sets up a ``torch.utils.hooks.BackwardHook`` around the inputs and the
outputs of a module that has full backward (pre-)hooks; on traced tensors that would need the
autograd graph capture does not build. While capturing, the two setup methods record
``module_inputs_hooked`` / ``module_outputs_hooked`` (``thunder_core.ops.module_hooks``) instead,
in the capturing thread only; every other call runs PyTorch's own.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
from torch.utils.hooks import BackwardHook

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import active_recorder
from thunder_core.ops.module_hooks import HookSite, module_inputs_hooked, module_outputs_hooked

_original_input = BackwardHook.setup_input_hook
_original_output = BackwardHook.setup_output_hook


def _captured(args) -> bool:
    return active_recorder() is not None and any(isinstance(a, TensorProxy) for a in args)


def _setup_input_hook(self, args):
    if not _captured(args):
        return _original_input(self, args)
    site = self._thunder_core_site = HookSite(self.module, self.user_hooks, self.user_pre_hooks)
    site.n_inputs = self.n_inputs = len(args)
    index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if not (torch.is_grad_enabled() and any(args[i].requires_grad for i in index)):
        return args  # as eager: no input needs a gradient, the hooks fire from the outputs
    site.input_index = self.input_tensors_index = index
    hooked = module_inputs_hooked(site, *[args[i] for i in index])
    values = list(args)
    for i, value in zip(index, hooked):
        values[i] = value
    return tuple(values) if type(args) is tuple else type(args)(*values)


def _setup_output_hook(self, args):
    site = getattr(self, "_thunder_core_site", None)
    single = not isinstance(args, tuple)
    values = (args,) if single else args
    if site is None or not _captured(values):
        return _original_output(self, args)
    site.n_outputs = self.n_outputs = len(values)
    index = [i for i, a in enumerate(values) if isinstance(a, torch.Tensor)]
    if not (torch.is_grad_enabled() and any(values[i].requires_grad for i in index)):
        return args
    site.output_index = self.output_tensors_index = index
    hooked = module_outputs_hooked(site, *[values[i] for i in index])
    out = list(values)
    for i, value in zip(index, hooked):
        out[i] = value
    return out[0] if single else tuple(out)


_lock = threading.Lock()
_active = 0


@contextmanager
def module_backward_hooks_recorded():
    """Within the block, modules with full backward hooks called on traced tensors record their hook points."""
    global _active
    with _lock:
        _active += 1
        BackwardHook.setup_input_hook = _setup_input_hook
        BackwardHook.setup_output_hook = _setup_output_hook
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                BackwardHook.setup_input_hook = _original_input
                BackwardHook.setup_output_hook = _original_output
