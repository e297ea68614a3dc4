"""Grouped-query attention without copies of the keys and values.

Models with fewer key/value heads than query heads (Llama, Mistral, Qwen2 and most recent
decoders) repeat each key/value head for its group of query heads before attention; Hugging
Face's ``repeat_kv`` does it as ``kv[:, :, None].expand(b, h, g, L, d).reshape(b, h * g, L, d)``,
and the reshape of the expanded tensor copies the whole cache on every call. PyTorch's
``scaled_dot_product_attention(..., enable_gqa=True)`` reads the shared heads in place (query
head ``i`` attends with key/value head ``i // g``, exactly the head the copy puts there). So on
the CPU, without autograd, an attention call whose key and value are such copies of two tensors
with the same grouping takes those tensors and ``enable_gqa=True``; the copies, unused then,
are removed as dead code. Not where a tensor involved (the copies, the tensors they copy, or a
view of them) is written in place between the copy and the attention (eager's copy holds the
values from before the write), and only with torch 2.9 or later and keys and values whose last
dimension is contiguous: before 2.9, and for other strides, PyTorch's CPU flash attention does
not take grouped heads and the call would fall back to its math kernel (slower, and refused
where only flash attention is allowed). Any other attention call, and any other use of the
copies, is left as it is.
"""

from __future__ import annotations

import functools
import time

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbolic import comparable_sizes
from thunder_core.ir.symbols import BoundSymbol
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ops.registry import TORCH_SYMBOLS
from thunder_core.transforms.updates import updated_in_place

_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@functools.cache
def _cpu_kernel_takes_groups() -> bool:
    """PyTorch's CPU flash attention takes grouped key/value heads from 2.9 (pytorch/pytorch#157893)."""
    return torch.__version__ >= (2, 9)  # a TorchVersion: compared as a version, not as text


def _is_full(index) -> bool:
    return isinstance(index, slice) and index.start is None and index.stop is None and index.step is None


def _inserted_group_dim(bsym: BoundSymbol, base: TensorProxy) -> bool:
    """Whether ``bsym`` makes ``base`` (b, h, L, d) into (b, h, 1, L, d): ``base[:, :, None]``
    (with full slices after it, or none) or ``base.unsqueeze(2)``."""
    out = bsym.flat_outputs()[0]
    shape = comparable_sizes(base.shape)
    if comparable_sizes(out.shape) != (*shape[:2], 1, *shape[2:]):
        return False
    name = bsym.symbol.name
    if name == "unsqueeze":
        return len(bsym.args) == 2 and bsym.args[1] in (2, -3) and not bsym.kwargs
    if name != "getitem" or len(bsym.args) != 2 or not isinstance(bsym.args[1], tuple):
        return False
    index = bsym.args[1]
    return (
        len(index) >= 3
        and _is_full(index[0])
        and _is_full(index[1])
        and index[2] is None
        and all(_is_full(i) for i in index[3:])
        and len(index) <= 5
    )


def _repeated_heads(value, producers: dict[str, BoundSymbol]) -> tuple[TensorProxy, int, BoundSymbol] | None:
    """``(base, g, insert)`` when ``value`` is ``base``'s heads each repeated ``g`` times in a row
    (the reshape of an expand of ``base[:, :, None]``, made by ``insert``); None otherwise."""
    if not isinstance(value, TensorProxy) or value.ndim != 4:
        return None
    reshape = producers.get(value.name)
    if reshape is None or reshape.symbol.name != "reshape":
        return None
    expanded = reshape.args[0]
    expand = producers.get(getattr(expanded, "name", None))
    if expand is None or expand.symbol.name != "expand" or not isinstance(expanded, TensorProxy):
        return None
    grouped = expand.args[0]
    insert = producers.get(getattr(grouped, "name", None))
    if insert is None or not isinstance(grouped, TensorProxy) or not insert.args:
        return None
    base = insert.args[0]
    if not isinstance(base, TensorProxy) or base.ndim != 4 or not _inserted_group_dim(insert, base):
        return None
    b, h, length, d = comparable_sizes(base.shape)
    expanded_shape = comparable_sizes(expanded.shape)
    if len(expanded_shape) != 5:
        return None
    g = expanded_shape[2]
    if not isinstance(g, int) or g < 2 or expanded_shape != (b, h, g, length, d):
        return None
    if comparable_sizes(value.shape) != (b, h * g, length, d) or comparable_sizes(base.stride())[-1] != 1:
        return None
    return base, g, insert


def _grouped_call(
    bsym: BoundSymbol, producers: dict[str, BoundSymbol], positions: dict[int, int], bsyms: list[BoundSymbol]
) -> BoundSymbol | None:
    """The attention call on the shared heads with ``enable_gqa=True``, or None to keep ``bsym``
    (``positions``: each bound symbol's index in ``bsyms``, the trace's)."""
    given = dict(zip(_PARAMETERS, bsym.args))
    given.update(bsym.kwargs)
    if given.get("enable_gqa", False) or given.get("dropout_p", 0.0) != 0.0:
        return None
    query, key, value = given.get("query"), given.get("key"), given.get("value")
    if not isinstance(query, TensorProxy) or query.ndim != 4:
        return None
    keys, values = _repeated_heads(key, producers), _repeated_heads(value, producers)
    if keys is None or values is None or keys[1] != values[1]:
        return None
    # The query's batch and heads exactly the copies' (no broadcasting, which grouped-query
    # attention does not do): head i of the query then attends with shared head i // g.
    if comparable_sizes(query.shape)[:2] != comparable_sizes(key.shape)[:2]:
        return None
    tensors = [query, key, value, keys[0], values[0]]
    mask = given.get("attn_mask")
    if isinstance(mask, TensorProxy):
        tensors.append(mask)
    if any(t.device.type != "cpu" or t.requires_grad for t in tensors):
        return None
    first = min(positions[id(keys[2])], positions[id(values[2])])
    written = updated_in_place(bsyms, first, positions[id(bsym)])  # with every view of what is written
    if any(t.name in written for t in (key, value, keys[0], values[0])):
        return None
    given.update(key=keys[0], value=values[0], enable_gqa=True)
    args = tuple(given.pop(name) for name in ("query", "key", "value"))
    return bsym.replace(args=args, kwargs=given, subsymbols=[])  # its decomposition was for the copies


def use_grouped_attention(trace: Trace) -> Trace:
    """``trace`` with each CPU attention call on repeated key/value heads made a grouped-query
    call on the heads themselves (see the module docstring); ``trace`` itself when there is none."""
    start = time.perf_counter()
    attention = TORCH_SYMBOLS.get("scaled_dot_product_attention")
    if (
        not _cpu_kernel_takes_groups()
        or attention is None
        or not any(b.symbol is attention for b in trace.bound_symbols)
    ):
        return trace
    producers = {p.name: b for b in trace.bound_symbols for p in b.flat_outputs()}
    positions = {id(b): i for i, b in enumerate(trace.bound_symbols)}
    bsyms, changed = [], False
    for bsym in trace.bound_symbols:
        grouped = (
            _grouped_call(bsym, producers, positions, trace.bound_symbols)
            if bsym.symbol is attention
            else None
        )
        changed |= grouped is not None
        bsyms.append(grouped if grouped is not None else bsym)
    if not changed:
        return trace
    return trace.with_bound_symbols(
        bsyms, Provenance("grouped-query attention on the shared heads", time.perf_counter() - start)
    )
