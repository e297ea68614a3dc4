"""NVIDIA Apex kernels: fused softmax-cross-entropy and fused RMSNorm / LayerNorm.

Apex's kernels carry their own autograd functions; the training rule lets PyTorch autograd
differentiate them (thunder_core's autograd fallback), so their fused backward kernels run.
"""

from __future__ import annotations

import importlib.util

import torch
from apex.normalization.fused_layer_norm import fused_layer_norm_affine, fused_rms_norm_affine

from thunder_core.extend import OperatorExecutor, Symbol, autograd_fallback, get_symbol, torch_symbols
from thunder_executor_apex.checks import cross_entropy_checker, norm_checker, xentropy_available

HAS_XENTROPY = xentropy_available(lambda name: importlib.util.find_spec(name) is not None)


def cross_entropy(logits, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):  # fmt: skip
    from apex.contrib.xentropy import SoftmaxCrossEntropyLoss

    losses = SoftmaxCrossEntropyLoss.apply(
        logits, target, label_smoothing, ignore_index, logits.dtype == torch.half
    )
    if reduction == "none":
        return losses.to(logits.dtype)
    total = losses.sum()
    if reduction == "sum":
        return total.to(logits.dtype)
    return (total / (target != ignore_index).sum()).to(logits.dtype)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    if weight is None:
        weight = torch.ones(normalized_shape, dtype=x.dtype, device=x.device)
    return fused_rms_norm_affine(x, weight, normalized_shape, eps)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if weight is None:
        weight = torch.ones(normalized_shape, dtype=x.dtype, device=x.device)
    if bias is None:
        bias = torch.zeros(normalized_shape, dtype=x.dtype, device=x.device)
    return fused_layer_norm_affine(x, weight, bias, normalized_shape, eps)


def build_executor() -> OperatorExecutor:
    executor = OperatorExecutor("apex")
    for name, fn, checker in (
        ("cross_entropy", cross_entropy, cross_entropy_checker(HAS_XENTROPY)),
        ("rms_norm", rms_norm, norm_checker("RMSNorm")),
        ("layer_norm", layer_norm, norm_checker("LayerNorm")),
    ):
        if name in torch_symbols():
            symbol = Symbol(f"apex_{name}", fn, f"apex_{name}", meta=None)
            executor.register_implementation(
                get_symbol(name), fn, checker=checker, grad=autograd_fallback(symbol)
            )
    return executor
