"""``torch.vmap`` called inside a captured function, recorded as ``thunder_core.vmap``.

Hugging Face builds its 4-D attention mask with ``torch.vmap`` nested four deep inside the
model's forward whenever a model adds a mask function of its own (``and_mask_function`` /
``or_mask_function`` of ``transformers.masking_utils``: Falcon always does). Capture cannot run
through torch.func's transforms: the tensors they wrap have no storage of their own to record.
While a capture runs on this thread, ``torch.vmap`` (also reached as ``torch.func.vmap``)
therefore maps the function with ``thunder_core.vmap``, which records it on one example's
stand-ins and replays it batched into the trace: the same values, and no transform at run time.
A function it returns and called after the capture runs through torch's own ``vmap``; code that
bound ``vmap`` by name before the capture began keeps torch's (capture then says that it cannot
record through torch.func transforms). Other threads get torch's ``vmap`` meanwhile.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

import torch
import torch.func

from thunder_core.ir.symbols import active_recorder

_lock = threading.Lock()
_installed = 0
_torch_vmap = torch.vmap  # what was installed before the first capture began
_capturing = threading.local()  # .active: this thread is capturing


def _recorded_when_capturing(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    torch_mapped = _torch_vmap(func, in_dims, out_dims, randomness, chunk_size=chunk_size)
    if not getattr(_capturing, "active", False) or torch._C._functorch.peek_interpreter_stack() is not None:
        return torch_mapped  # another thread's, or inside a transform torch.func itself runs
    from thunder_core.functional import vmap

    recorded = vmap(func, in_dims, out_dims, randomness, chunk_size=chunk_size)

    @functools.wraps(func)
    def mapped(*args, **kwargs):
        if active_recorder() is not None and getattr(_capturing, "active", False):
            return recorded(*args, **kwargs)
        return torch_mapped(*args, **kwargs)

    return mapped


def torch_vmap():
    """PyTorch's own ``torch.vmap`` (what thunder-core runs an operation without a batching rule
    through), also while captures have it replaced."""
    return _torch_vmap if _installed else torch.vmap


@contextmanager
def vmap_recorded():
    """While capturing on this thread, ``torch.vmap`` records the mapping (see the module docstring)."""
    global _installed, _torch_vmap
    with _lock:
        if _installed == 0:
            _torch_vmap = torch.vmap
            torch.vmap = torch.func.vmap = _recorded_when_capturing
        _installed += 1
    outer = getattr(_capturing, "active", False)
    _capturing.active = True
    try:
        yield
    finally:
        _capturing.active = outer
        with _lock:
            _installed -= 1
            if _installed == 0:
                torch.vmap = torch.func.vmap = _torch_vmap
