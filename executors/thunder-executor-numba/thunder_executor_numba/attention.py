"""One-query attention over a KV cache (batch-1 decoding) as a Numba kernel that skips masked keys.

A decoding step attends one new query to a KV cache allocated for the longest sequence, with a
boolean mask saying which cache positions hold tokens yet. ATen's CPU attention computes the
scores of every position and masks them afterwards, reading the whole cache. This kernel reads
the mask first and touches the keys and values of the allowed positions only (an online softmax,
one head per thread), so a step costs what the tokens so far cost, not the cache's size.
Masked positions have zero weight in eager too (``exp(-inf)``), so the result is eager's up to
the order of the sums; a row with every position masked gives zeros, as PyTorch's own attention
does (since torch 2.5).

Claimed for inference only (no grad), one query row, a boolean ``attn_mask``, no dropout, no
``is_causal``, as many key/value heads as query heads, float32/float64 CPU tensors.
"""

from __future__ import annotations

import math

import torch

from thunder_core import Rejection
from thunder_core.extend import TensorProxy

DTYPES = (torch.float32, torch.float64)
PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def is_attention(bsym) -> bool:
    return not bsym.symbol.is_prim and bsym.symbol.name == "scaled_dot_product_attention"


def _bound(bsym) -> dict:
    values = dict(DEFAULTS)
    values.update(zip(PARAMETERS, bsym.args))
    values.update(bsym.kwargs)
    return values


def check_decode_attention(bsym) -> bool | Rejection:
    """Whether this ``scaled_dot_product_attention`` is a one-query step this kernel runs."""
    a = _bound(bsym)
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not all(isinstance(t, TensorProxy) for t in (q, k, v, mask)):
        return Rejection("numba attention: query, key, value and a boolean attn_mask, all tensors")
    if isinstance(bsym.output, TensorProxy) and bsym.output.requires_grad:
        return Rejection("numba attention: inference only (the output requires grad)")
    if a["dropout_p"] != 0.0 or a["is_causal"] or a["enable_gqa"]:
        return Rejection("numba attention: no dropout, is_causal or enable_gqa")
    if mask.dtype != torch.bool:
        return Rejection("numba attention: a boolean attn_mask (an additive float mask stays with ATen)")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[2] != 1:
        return Rejection("numba attention: one query row of 4-D (batch, heads, length, dim) tensors")
    if k.shape[:2] != q.shape[:2] or v.shape[:3] != k.shape[:3] or k.shape[3] != q.shape[3]:
        return Rejection("numba attention: as many key/value heads as query heads, matching sizes")
    if any(t.device.type != "cpu" or t.dtype != q.dtype for t in (k, v)) or q.dtype not in DTYPES:
        return Rejection("numba attention: float32/float64 CPU tensors of one dtype")
    try:
        torch.broadcast_shapes(tuple(mask.shape), (q.shape[0], q.shape[1], 1, k.shape[2]))
    except RuntimeError:
        return Rejection("numba attention: the mask does not broadcast to (batch, heads, 1, length)")
    return True


def decode_attention(region):
    """The region callable for one claimed attention: the kernel on NumPy views, a fresh output."""
    (bsym,) = region.bound_symbols
    a = _bound(bsym)
    names = [p.name for p in region.inputs]
    positions = [names.index(a[key].name) for key in ("query", "key", "value", "attn_mask")]
    q_shape, length = tuple(a["query"].shape), a["key"].shape[2]
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q_shape[-1])
    out_shape = tuple(bsym.output.shape)
    mask_shape = (q_shape[0], q_shape[1], 1, length)
    from thunder_executor_numba.kernels import decode_attention as kernel  # numba, at the first compile

    def run(*tensors):
        q, k, v, mask = (tensors[i].detach() for i in positions)
        out = torch.empty(out_shape, dtype=q.dtype)
        mask = torch.broadcast_to(mask, mask_shape)
        kernel(q.numpy(), k.numpy(), v.numpy(), mask.numpy(), scale, out.numpy())
        return (out,)

    run.source = "numba attention: online softmax over the unmasked cache positions, one head per thread"
    return run
