"""Building blocks of VJP rules: calling torch-level symbols, un-broadcasting, casting."""

from __future__ import annotations

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbolic import same_sizes
from thunder_core.ops.registry import TORCH_SYMBOLS


class _TorchOps:
    """``ops.mul(a, b)`` calls (and so records) the torch-level symbol ``mul``."""

    def __getattr__(self, name: str):
        return TORCH_SYMBOLS[name]


ops = _TorchOps()


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def sum_to(g, shape):
    """Sum ``g`` down to ``shape`` (undo broadcasting)."""
    shape = tuple(shape)
    if same_sizes(g.shape, shape):
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    if dims:
        g = ops.sum(g, dims, True)
    return g if same_sizes(g.shape, shape) else ops.reshape(g, shape)


def like(g, x):
    """``g`` with ``x``'s shape (summing broadcast dims) and dtype."""
    if g is None or not isinstance(x, TensorProxy):
        return None
    g = sum_to(g, x.shape)
    if g.dtype != x.dtype:
        g = ops.to(g, x.dtype)
    return g


def product(p, q):
    """``p @ q``; when the contracted dimension has size 1 (an outer product, as in the gradient of
    a weight from one example) the broadcast multiply ``p * q``: the same values, and an
    elementwise op that fusion executors fuse instead of a matrix multiply with K = 1."""
    if p.ndim >= 2 and q.ndim >= 2 and _is_one(p.shape[-1]) and _is_one(q.shape[-2]):
        return ops.mul(p, q)
    return ops.matmul(p, q)


def _is_one(size) -> bool:
    return isinstance(size, int) and size == 1


def zeros_for(x):
    return ops.zeros_like(x)
