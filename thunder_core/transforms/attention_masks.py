"""A boolean attention mask that several attention calls share, made additive once.

``F.scaled_dot_product_attention`` turns a boolean ``attn_mask`` into an additive one (0.0
where attention is allowed, -inf elsewhere, in the query's dtype) on every call, before its
kernel runs. A model passes the same mask to the attention of every layer (a decoding step's
causal mask), so the program converts it once, with the operation PyTorch uses, and gives the
additive mask to each call: the same values reach the same kernels, and the results are
eager's bit for bit. Only for calls on the CPU that autograd does not go through (inference):
how other devices' kernels take a boolean mask is theirs to decide.
"""

from __future__ import annotations

import math

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.trace import Trace
from thunder_core.ops.registry import TORCH_SYMBOLS
from thunder_core.transforms.replay import replay

_MASK_POSITION = 3  # scaled_dot_product_attention(query, key, value, attn_mask, ...)


def _boolean_mask(bsym) -> tuple[TensorProxy, torch.dtype] | None:
    """The boolean CPU mask of an attention call autograd does not reach, with its query's dtype."""
    if bsym.symbol is not TORCH_SYMBOLS.get("scaled_dot_product_attention"):
        return None
    mask = bsym.kwargs.get(
        "attn_mask", bsym.args[_MASK_POSITION] if len(bsym.args) > _MASK_POSITION else None
    )
    tensors = [*bsym.args[:3], mask]
    if not isinstance(mask, TensorProxy) or mask.dtype != torch.bool:
        return None
    if not all(
        isinstance(t, TensorProxy) and t.device.type == "cpu" and not t.requires_grad for t in tensors
    ):
        return None
    return mask, bsym.args[0].dtype


def share_mask_conversions(trace: Trace) -> Trace:
    """``trace`` with each boolean mask that two or more attention calls share made additive once
    (``trace`` itself when there is none)."""
    uses: dict[tuple[str, torch.dtype], int] = {}
    for bsym in trace.bound_symbols:
        found = _boolean_mask(bsym)
        if found is not None:
            key = (found[0].name, found[1])
            uses[key] = uses.get(key, 0) + 1
    shared = {key for key, count in uses.items() if count > 1}
    if not shared:
        return trace
    converted: dict[tuple[str, torch.dtype], TensorProxy] = {}

    def visit(bsym, args, kwargs):
        found = _boolean_mask(bsym)
        if found is None or (found[0].name, found[1]) not in shared:
            return bsym.symbol(*args, **kwargs)
        key = (found[0].name, found[1])
        mask = kwargs["attn_mask"] if "attn_mask" in kwargs else args[_MASK_POSITION]
        if key not in converted:
            additive = TORCH_SYMBOLS["where"](mask, 0.0, -math.inf)
            if additive.dtype != found[1]:
                additive = TORCH_SYMBOLS["to"](additive, found[1])
            converted[key] = additive
        if "attn_mask" in kwargs:
            kwargs = {**kwargs, "attn_mask": converted[key]}
        else:
            args = (*args[:_MASK_POSITION], converted[key], *args[_MASK_POSITION + 1 :])
        return bsym.symbol(*args, **kwargs)

    return replay(trace, visit, name="attention masks made additive once")
