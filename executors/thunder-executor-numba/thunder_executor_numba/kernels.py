"""The fixed Numba kernels (one-row linear, decode attention), imported when one is first compiled.

Importing ``numba`` is left to the first region that needs it, so a job whose programs never
reach a Numba region does not pay for it.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# Reordering the sums lets LLVM vectorize them; the other fast-math flags (no NaN, no infinity)
# would let it drop NaN and infinity propagation, which eager keeps.
_REASSOCIATE = {"reassoc", "contract"}


@numba.njit(parallel=True, fastmath=_REASSOCIATE, cache=True)
def gemv(w, x, out):  # pragma: no cover - compiled by Numba
    n, k = w.shape
    for i in numba.prange(n):
        acc = w.dtype.type(0.0)
        for j in range(k):
            acc += w[i, j] * x[j]
        out[i] = acc


@numba.njit(parallel=True, fastmath=_REASSOCIATE, cache=True)
def gemv_bias(w, x, b, out):  # pragma: no cover - compiled by Numba
    n, k = w.shape
    for i in numba.prange(n):
        acc = w.dtype.type(0.0)
        for j in range(k):
            acc += w[i, j] * x[j]
        out[i] = acc + b[i]


@numba.njit(parallel=True, fastmath=_REASSOCIATE, cache=True)
def decode_attention(q, k, v, mask, scale, out):  # pragma: no cover - compiled by Numba
    batch, heads, _, dim = q.shape
    length, value_dim = k.shape[2], v.shape[3]
    for bh in numba.prange(batch * heads):
        b, h = bh // heads, bh % heads
        acc = np.zeros(value_dim, dtype=out.dtype)
        best = -np.inf
        total = 0.0
        for j in range(length):
            if not mask[b, h, 0, j]:
                continue
            score = 0.0
            for d in range(dim):
                score += q[b, h, 0, d] * k[b, h, j, d]
            score *= scale
            if score > best:
                shrink = math.exp(best - score)
                total *= shrink
                for d in range(value_dim):
                    acc[d] *= shrink
                best = score
            weight = math.exp(score - best)
            total += weight
            for d in range(value_dim):
                acc[d] += weight * v[b, h, j, d]
        for d in range(value_dim):  # every position masked: zeros, as PyTorch's attention gives
            out[b, h, 0, d] = acc[d] / total if total > 0.0 else 0.0
