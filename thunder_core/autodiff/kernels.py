"""Symbols for ATen's backward kernels and the forward variants that feed them.

Rules use them so that the backward runs the same kernels as eager autograd.
"""

from __future__ import annotations

import torch

from thunder_core.ir.symbols import RANDOM, Symbol


def _aten(name: str, tags=()) -> Symbol:
    op = getattr(torch.ops.aten, name).default
    return Symbol(
        name=f"aten.{name}", impl=op, printed_name=f"torch.ops.aten.{name}.default", tags=frozenset(tags)
    )


softmax_backward = _aten("_softmax_backward_data")
log_softmax_backward = _aten("_log_softmax_backward_data")
log_softmax = _aten("_log_softmax")
native_layer_norm = _aten("native_layer_norm")
native_layer_norm_backward = _aten("native_layer_norm_backward")
embedding_dense_backward = _aten("embedding_dense_backward")
gelu_backward = _aten("gelu_backward")
silu_backward = _aten("silu_backward")
threshold_backward = _aten("threshold_backward")
sigmoid_backward = _aten("sigmoid_backward")
tanh_backward = _aten("tanh_backward")
native_dropout = _aten("native_dropout", tags=(RANDOM,))
native_dropout_backward = _aten("native_dropout_backward")
nll_loss_forward = _aten("nll_loss_forward")
nll_loss_backward = _aten("nll_loss_backward")
slice_backward = _aten("slice_backward")
flash_attention_cpu = _aten("_scaled_dot_product_flash_attention_for_cpu")
flash_attention_cpu_backward = _aten("_scaled_dot_product_flash_attention_for_cpu_backward")
efficient_attention = _aten("_scaled_dot_product_efficient_attention")
efficient_attention_backward = _aten("_scaled_dot_product_efficient_attention_backward")


def _attention_bias(mask: torch.Tensor, shape, alignment: int = 16) -> torch.Tensor:
    """``mask`` as the memory-efficient attention kernels take their bias, as eager SDPA prepares
    it: every stride but the last a multiple of ``alignment`` elements (16 bytes at least), else
    padded along the last dimension and narrowed back, then expanded to ``shape``. Runs on the
    tensor the kernel gets, whatever layout the executors before it gave the mask; with symbolic
    strides (capture) it pads without asking, so no size guard comes of it."""
    strides = mask.stride()
    known = all(isinstance(s, int) for s in strides)
    if not (known and strides[-1] == 1 and all(s % alignment == 0 for s in strides[:-1])):
        last = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, alignment - last % alignment)).narrow(-1, 0, last)
    return mask.expand(shape)


attention_bias = Symbol(name="attention_bias", impl=_attention_bias, printed_name="attention_bias")
