"""Which scaled_dot_product_attention calls cuDNN's SDPA graph takes (pure logic on proxies)."""

from __future__ import annotations

import torch

from thunder_core import Rejection

DTYPES = (torch.float16, torch.bfloat16)


def sdpa_checker(capability: tuple[int, int]):
    """A checker for a device of ``capability``; it states each limit it rejects on."""
    max_head_dim = 256 if capability >= (9, 0) else 128

    def check(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if capability < (8, 0):
            return Rejection(
                f"cuDNN SDPA needs compute capability 8.0+, this device has {capability[0]}.{capability[1]}"
            )
        tensors = (q, k, v)
        if any(t.device.type != "cuda" for t in tensors):
            return Rejection("cuDNN SDPA runs CUDA tensors")
        if q.dtype not in DTYPES or any(t.dtype != q.dtype for t in tensors):
            return Rejection(
                f"cuDNN SDPA takes float16 or bfloat16 q, k, v of one dtype (got {[t.dtype for t in tensors]})"
            )
        if any(t.ndim != 4 for t in tensors):
            return Rejection("cuDNN SDPA takes 4-d (batch, heads, sequence, head_dim) tensors")
        head_dim = q.shape[-1]
        if head_dim > max_head_dim or head_dim % 8 or v.shape[-1] != head_dim:
            return Rejection(
                f"head dim must be a multiple of 8 up to {max_head_dim} on this device (got {head_dim})"
            )
        if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
            return Rejection("cuDNN SDPA here needs as many key/value heads as query heads")
        if attn_mask is not None:
            return Rejection("cuDNN SDPA here supports is_causal, not an explicit attn_mask")
        if dropout_p != 0.0:
            return Rejection("cuDNN SDPA here does not implement dropout")
        if any(t.stride(-1) != 1 for t in tensors):
            return Rejection("the head dim must be contiguous (stride 1)")
        return True

    return check


def in_layout_of(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values with ``like``'s strides: a cuDNN graph reads memory in the layout it was
    built for, so a gradient arriving in another layout must be copied into that one."""
    if tensor.stride() == like.stride():
        return tensor
    out = torch.empty_strided(like.shape, like.stride(), dtype=tensor.dtype, device=tensor.device)
    return out.copy_(tensor)


def sdpa_stats_arguments(frontend_version: str, training: bool) -> dict:
    """How ``graph.sdpa`` is told whether to produce the softmax statistics the backward needs.

    cudnn-frontend 1.13 introduced ``generate_stats`` and deprecated ``is_inference``, which
    means the opposite; older releases know only ``is_inference``.
    """
    from packaging.version import Version

    if Version(frontend_version) >= Version("1.13"):
        return {"generate_stats": training}
    return {"is_inference": not training}
