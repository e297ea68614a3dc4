"""Which calls Apex's fused kernels take (pure logic on proxies)."""

from __future__ import annotations

import torch

from thunder_core import Rejection

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def cross_entropy_checker(has_xentropy: bool):
    def check(logits, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
              reduction="mean", label_smoothing=0.0):  # fmt: skip
        if not has_xentropy:
            return Rejection("apex was built without --xentropy (no apex.contrib.xentropy)")
        if logits.device.type != "cuda" or logits.dtype not in FLOATS:
            return Rejection("apex cross-entropy takes float16/bfloat16/float32 CUDA logits")
        if logits.ndim != 2 or target.ndim != 1 or target.dtype != torch.int64:
            return Rejection("apex cross-entropy takes (N, C) logits and (N,) int64 class indices")
        if weight is not None or size_average is not None or reduce is not None:
            return Rejection("apex cross-entropy has no class weights or legacy reduction arguments")
        if reduction not in ("mean", "sum", "none"):
            return Rejection(f"unknown reduction {reduction!r}")
        return True

    return check


def norm_checker(kind: str):
    def check(x, normalized_shape, weight=None, *rest, **kwargs):
        if x.device.type != "cuda" or x.dtype not in FLOATS:
            return Rejection(f"apex fused {kind} takes float16/bfloat16/float32 CUDA tensors")
        if tuple(x.shape[-len(normalized_shape) :]) != tuple(normalized_shape):
            return Rejection("normalized_shape must be the trailing dims of the input")
        # fused_layer_norm_affine / fused_rms_norm_affine (not the mixed_dtype_* variants) need the
        # weight and bias in the input's dtype.
        params = [weight, *(p for p in (*rest, kwargs.get("bias")) if isinstance(p, torch.Tensor))]
        if any(p is not None and p.dtype != x.dtype for p in params):
            return Rejection("apex fused norms here take a weight and bias of the input's dtype")
        return True

    return check


def xentropy_available(find) -> bool:
    """apex.contrib.xentropy imports its compiled ``xentropy_cuda`` extension: both must be there.

    ``find(name)`` says whether a module can be found (``importlib.util.find_spec`` without importing).
    """
    return find("apex.contrib.xentropy") and find("xentropy_cuda")
