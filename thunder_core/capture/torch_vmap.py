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
record through torch.func transforms). Other threads, and Dynamo tracing on them, get torch's
``vmap`` meanwhile.
"""

from __future__ import annotations

import functools

import torch
import torch._functorch.apis
import torch.func

from thunder_core.capture.while_capturing import PatchedWhileCapturing
from thunder_core.ir.symbols import active_recorder

_replaced: dict[object, object] = {}  # module -> the vmap it had when the first capture began
_recording_vmap = None  # thunder_core.vmap, given by thunder_core.functional (a higher layer)


def record_vmap_with(vmap) -> None:
    """The ``vmap`` that records a mapping into the capture (``thunder_core.vmap``)."""
    global _recording_vmap
    _recording_vmap = vmap


def original_vmap():
    """PyTorch's own ``vmap`` (what thunder-core runs an operation without a batching rule
    through), also while captures have ``torch.vmap`` replaced."""
    return torch._functorch.apis.vmap


def _capturing_here() -> bool:
    return (
        _patch.active()
        and not torch.compiler.is_dynamo_compiling()
        and torch._C._functorch.peek_interpreter_stack() is None  # not inside a transform torch.func runs
    )


def _recorded_when_capturing(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    torch_mapped = original_vmap()(func, in_dims, out_dims, randomness, chunk_size=chunk_size)
    if _recording_vmap is None or not _capturing_here():
        return torch_mapped
    recorded = _recording_vmap(func, in_dims, out_dims, randomness, chunk_size=chunk_size)

    @functools.wraps(func)
    def mapped(*args, **kwargs):
        if active_recorder() is not None and _capturing_here():
            return recorded(*args, **kwargs)
        return torch_mapped(*args, **kwargs)

    return mapped


def _install() -> None:
    for module in (torch, torch.func):
        if module.vmap is not _recorded_when_capturing:
            _replaced[module] = module.vmap
            module.vmap = _recorded_when_capturing


def _restore() -> None:
    for module, previous in _replaced.items():
        if module.vmap is _recorded_when_capturing:  # not replaced again meanwhile
            module.vmap = previous
    _replaced.clear()


_patch = PatchedWhileCapturing(_install, _restore)


def vmap_recorded():
    """While capturing on this thread, ``torch.vmap`` records the mapping (see the module docstring)."""
    return _patch.capturing()
