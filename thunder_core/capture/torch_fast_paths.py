"""PyTorch modules whose eager fast path gives other values than the path capture can record.

While capturing, ``torch.compiler.is_compiling()`` is True (``thunder_core.capture.capture``),
and PyTorch's modules then leave their fast paths, as they do under ``torch.compile``. For most
of them the values are the same either way. ``nn.TransformerEncoder`` with a
``src_key_padding_mask`` in inference is the exception: eager packs the unpadded positions into
a nested tensor, runs the layers on it and pads the result with zeros, so every padded position
of its output is 0 (or, with a final ``norm``, the norm of 0); the padded path computes a value
there. ``encoder_fast_path_as_eager`` makes a capture record what eager computes: the padded
path, then the padded positions set to 0 where eager would have taken the nested path.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
from torch import nn

from thunder_core.capture.while_capturing import PatchedWhileCapturing

_original_forward = nn.TransformerEncoder.forward  # what was installed before the first capture began
_capturing = threading.local()  # .reads: global switches read while deciding, on this thread


def _takes_nested_path(encoder: nn.TransformerEncoder, src, mask, padding_mask) -> bool:
    """Whether eager ``TransformerEncoder.forward`` (PyTorch 2.x) converts to a nested tensor here,
    apart from the mask's left alignment (data, decided when the program runs)."""
    first = encoder.layers[0]
    weights = (
        src,
        first.self_attn.in_proj_weight,
        first.self_attn.in_proj_bias,
        first.self_attn.out_proj.weight,
        first.self_attn.out_proj.bias,
        first.norm1.weight,
        first.norm1.bias,
        first.norm2.weight,
        first.norm2.bias,
        first.linear1.weight,
        first.linear1.bias,
        first.linear2.weight,
        first.linear2.bias,
    )
    fastpath = torch.backends.mha.get_fastpath_enabled()
    _capturing.reads[torch.backends.mha.get_fastpath_enabled] = fastpath  # for capture to guard
    return (
        fastpath
        and getattr(encoder, "use_nested_tensor", False)
        and not first.training
        and src.dim() == 3
        and padding_mask is not None
        and mask is None
        and not torch.is_autocast_enabled()
        and src.device.type in ("cpu", "cuda", "xpu")
        and not (torch.is_grad_enabled() and any(w is not None and w.requires_grad for w in weights))
    )


def _encoder_forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
    if not _patch.active():
        return _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    from torch.nn import functional as F

    padding = F._canonical_mask(
        mask=src_key_padding_mask,
        mask_name="src_key_padding_mask",
        other_type=F._none_or_dtype(mask),
        other_name="mask",
        target_type=src.dtype,
    )
    canonical = F._canonical_mask(
        mask=mask, mask_name="mask", other_type=None, other_name="", target_type=src.dtype, check_other=False
    )
    if not _takes_nested_path(self, src, canonical, padding):
        return _original_forward(self, src, mask, src_key_padding_mask, is_causal)
    output = src
    for layer in self.layers:  # the padded path: each layer's attention leaves the padded keys out
        # (eager's layers on a nested tensor take no mask, and their fast kernel ignores is_causal)
        output = layer(output, src_mask=None, is_causal=False, src_key_padding_mask=padding)
    kept = padding.logical_not()  # what eager packs into the nested tensor
    padded = kept.logical_not()
    if getattr(self, "mask_check", True):
        # Eager packs only a left-aligned mask (no kept position after a padded one); any other
        # takes the padded path, and its padded positions keep their values.
        left_aligned = (kept[:, 1:] <= kept[:, :-1]).all()
        padded = padded & left_aligned
    output = output.masked_fill(padded.unsqueeze(-1), 0.0)
    if self.norm is not None:
        output = self.norm(output)
    return output


def _install() -> None:
    global _original_forward
    _original_forward = nn.TransformerEncoder.forward
    nn.TransformerEncoder.forward = _encoder_forward


def _restore() -> None:
    nn.TransformerEncoder.forward = _original_forward


_patch = PatchedWhileCapturing(_install, _restore)


@contextmanager
def encoder_fast_path_as_eager(guard_builder=None):
    """While capturing on this thread, ``nn.TransformerEncoder`` gives eager's values at padded
    positions (see the module docstring). Other threads run the original forward meanwhile.
    Global switches read in deciding (``torch.backends.mha.get_fastpath_enabled()``) become
    checks of ``guard_builder``."""
    outer_reads = getattr(_capturing, "reads", {})
    _capturing.reads = {}
    try:
        with _patch.capturing():
            yield
        if guard_builder is not None:
            for read, value in _capturing.reads.items():
                name = guard_builder.bind(read, "switch")
                guard_builder.equal(f"{name}()", value, f"{read.__module__}.{read.__qualname__}()")
    finally:
        _capturing.reads = outer_reads
