"""One-row (batch-1 decoding) low-bit matmuls as parallel Numba kernels, when Numba is installed.

Decoding multiplies one activation row by each weight: the time is reading the weights, and
PyTorch's CPU low-bit kernels are slow for one row (``_weight_int8pack_mm`` reads int8 weights
slower than float32 ``linear`` reads four times the bytes). These kernels read the same packed
weights the ATen kernels take:

- int8 ``[N, K]``: ``out[n] = scale[n] * sum_k x[k] * q[n, k]``;
- int4 in the CPU layout of ``_convert_weight_to_int4pack_for_cpu``: rows in blocks of 64;
  block ``b``, input feature ``k`` is 32 bytes at ``(b * K + k) * 32``, byte ``j`` holding row
  ``64 b + j`` in its low and row ``64 b + j + 32`` in its high nibble;
  ``w = (q - 8) * scale + zero`` per group of input features.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

AVAILABLE = importlib.util.find_spec("numba") is not None
_kernels: dict = {}


def _compile():
    if _kernels:
        return _kernels
    import numba

    flags = {"reassoc", "contract"}

    @numba.njit(parallel=True, fastmath=flags, cache=True)
    def int8_gemv(q, scale, x, out):  # pragma: no cover - compiled by Numba
        n, k = q.shape
        for i in numba.prange(n):
            acc = np.float32(0.0)
            for j in range(k):
                acc += np.float32(q[i, j]) * x[j]
            out[i] = acc * scale[i]

    @numba.njit(parallel=True, fastmath=flags, cache=True)
    def int4_gemv(packed, scales_and_zeros, x, group_size, out):  # pragma: no cover
        k_total = x.shape[0]
        groups = k_total // group_size
        sums = np.zeros(groups, np.float32)
        for g in range(groups):
            for k in range(g * group_size, (g + 1) * group_size):
                sums[g] += x[k]
        for b in numba.prange(out.shape[0] // 64):
            result = np.zeros(64, np.float32)
            acc = np.zeros(64, np.float32)
            for g in range(groups):
                acc[:] = 0.0
                for k in range(g * group_size, (g + 1) * group_size):
                    xk = x[k]
                    offset = (b * k_total + k) * 32
                    for j in range(32):
                        byte = packed[offset + j]
                        acc[j] += xk * np.float32(byte & 15)
                        acc[j + 32] += xk * np.float32(byte >> 4)
                for j in range(64):
                    n = b * 64 + j
                    result[j] += (
                        scales_and_zeros[g, n, 0] * (acc[j] - 8 * sums[g])
                        + scales_and_zeros[g, n, 1] * sums[g]
                    )
            out[b * 64 : (b + 1) * 64] = result

    _kernels.update(int8=int8_gemv, int4=int4_gemv)
    return _kernels


def applies(x: torch.Tensor, rows_of_weight: int, kind: str) -> bool:
    """One float32 CPU row, Numba installed, and (int4) whole blocks of 64 output rows in the
    packed layout this kernel reads (``int4_layout_is_known``)."""
    if not AVAILABLE or x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() != x.shape[-1]:
        return False
    return kind == "int8" or (rows_of_weight % 64 == 0 and int4_layout_is_known())


_layout_known: list[bool] = []


@torch.no_grad()
def int4_layout_is_known() -> bool:
    """Whether this machine's ``_convert_weight_to_int4pack_for_cpu`` packs in the layout ``int4``
    reads. The layout depends on the CPU's vector width (the one above is AVX-512's); checked once
    against the ATen kernel on a random weight, and where it differs the ATen kernel runs instead."""
    if not _layout_known:
        generator = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (64, 128), dtype=torch.int32, generator=generator)
        scales_and_zeros = torch.rand(2, 64, 2, generator=generator)
        x = torch.randn(1, 128, generator=generator)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        expected = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, scales_and_zeros)
        same = packed.numel() == 64 * 128 // 2 and torch.allclose(
            int4(x, packed, scales_and_zeros, 64), expected, rtol=1e-4, atol=1e-3
        )
        _layout_known.append(bool(same))
    return _layout_known[0]


def int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    out = torch.empty((*x.shape[:-1], q.shape[0]), dtype=x.dtype)
    _compile()["int8"](
        q.numpy(), scale.numpy(), x.detach().reshape(-1).contiguous().numpy(), out.view(-1).numpy()
    )
    return out


def int4(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    out = torch.empty((*x.shape[:-1], packed.shape[0]), dtype=x.dtype)
    flat_x = x.detach().reshape(-1).contiguous().numpy()
    _compile()["int4"](
        packed.reshape(-1).numpy(), scales_and_zeros.numpy(), flat_x, group_size, out.view(-1).numpy()
    )
    return out
