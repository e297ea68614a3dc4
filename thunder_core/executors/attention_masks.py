"""A boolean attention mask that several of torch's attention calls share, made additive once.

``F.scaled_dot_product_attention`` turns a boolean ``attn_mask`` into an additive one (0.0
where attention is allowed, -inf elsewhere, in the query's dtype) on every call, before its
kernel runs. A model passes the same mask to the attention of every layer (a decoding step's
causal mask), so after executors have claimed a program, the attention calls torch runs that
share a mask get it converted once, by the operation PyTorch uses, placed before the first of
them: the same values reach the same kernels, and the results are eager's bit for bit. Only on
the CPU and without autograd through the attention (how other devices' kernels take a boolean
mask is theirs to decide), never for a call another executor claimed (its kernel may take the
boolean mask as it is), and not for a mask the program writes in place (or a view of it).
"""

from __future__ import annotations

import math

import torch

from thunder_core.capture.recorder import Namer, Recorder
from thunder_core.executors.fusion import TORCH, to_torch
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import pop_recorder, push_recorder
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ops.registry import TORCH_SYMBOLS
from thunder_core.transforms.replay import all_names
from thunder_core.transforms.updates import updated_in_place

_PARAMETERS = ("query", "key", "value", "attn_mask")  # scaled_dot_product_attention's first four
_MASK_POSITION = 3


def _boolean_mask(bsym) -> tuple[TensorProxy, torch.dtype] | None:
    """The boolean CPU mask of an attention call torch runs without autograd, with its query's dtype."""
    if bsym.executor != TORCH or bsym.symbol is not TORCH_SYMBOLS.get("scaled_dot_product_attention"):
        return None
    given = dict(zip(_PARAMETERS, bsym.args))
    given.update((name, bsym.kwargs[name]) for name in _PARAMETERS if name in bsym.kwargs)
    tensors = [given.get(name) for name in _PARAMETERS]
    mask = tensors[_MASK_POSITION]
    if not isinstance(mask, TensorProxy) or mask.dtype != torch.bool:
        return None
    if not all(
        isinstance(t, TensorProxy) and t.device.type == "cpu" and not t.requires_grad for t in tensors
    ):
        return None
    return mask, tensors[0].dtype


def _with_mask(bsym, additive: TensorProxy):
    """The attention call with ``additive`` for its mask; run whole by torch (its decomposition,
    written for the boolean mask, is dropped)."""
    if "attn_mask" in bsym.kwargs:
        return bsym.replace(kwargs={**bsym.kwargs, "attn_mask": additive}, subsymbols=[])
    args = (*bsym.args[:_MASK_POSITION], additive, *bsym.args[_MASK_POSITION + 1 :])
    return bsym.replace(args=args, subsymbols=[])


def share_mask_conversions(trace: Trace) -> Trace:
    """``trace`` (claimed by executors) with each boolean mask that two or more of torch's
    attention calls share made additive once; ``trace`` itself when there is none."""
    uses: dict[tuple[str, torch.dtype], int] = {}
    for bsym in trace.bound_symbols:
        found = _boolean_mask(bsym)
        if found is not None:
            uses[found[0].name, found[1]] = uses.get((found[0].name, found[1]), 0) + 1
    written = updated_in_place(trace.bound_symbols)  # a mask written between two calls: each converts it
    uses = {key: count for key, count in uses.items() if key[0] not in written}
    if not any(count > 1 for count in uses.values()):
        return trace
    namer = Namer(all_names(trace))
    converted: dict[tuple[str, torch.dtype], TensorProxy] = {}
    bsyms = []
    for bsym in trace.bound_symbols:
        found = _boolean_mask(bsym)
        key = (found[0].name, found[1]) if found is not None else None
        if key is None or uses.get(key, 0) < 2:
            bsyms.append(bsym)
            continue
        if key not in converted:
            recorder = Recorder(namer, top_level=False)
            push_recorder(recorder)
            try:
                additive = TORCH_SYMBOLS["where"](found[0], 0.0, -math.inf)
                if additive.dtype != found[1]:
                    additive = TORCH_SYMBOLS["to"](additive, found[1])
            finally:
                pop_recorder()
            bsyms += [to_torch(b).replace(source=bsym.source) for b in recorder.bound_symbols]
            converted[key] = additive
        bsyms.append(_with_mask(bsym, converted[key]))
    return trace.with_bound_symbols(bsyms, Provenance("attention masks made additive once", 0.0))
