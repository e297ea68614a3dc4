"""Weight-only low-bit formats and the PyTorch CPU kernels that multiply by them.

- int8, per output channel, symmetric: ``w ≈ q * scale[:, None]`` with ``q`` int8 ``[N, K]``;
  ``torch._weight_int8pack_mm(x2d, q, scale)`` computes ``x2d @ w.T``.
- int4, group-wise, asymmetric with the zero point in the float domain (the tinygemm layout):
  per group of ``group_size`` input features, ``w ≈ (q - 8) * scale + zero`` with ``q`` in 0..15,
  packed by ``torch._convert_weight_to_int4pack_for_cpu`` into uint8 ``[N, K / 2]``, and
  ``scales_and_zeros`` ``[K / group_size, N, 2]``; ``torch._weight_int4pack_mm_for_cpu`` multiplies.
"""

from __future__ import annotations

import torch

from thunder_plugin_quantization import one_row

INT4_INNER_K_TILES = 2


@torch.no_grad()
def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
    q = torch.round(weight / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale.to(weight.dtype)


@torch.no_grad()
def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU layout, rows padded with zeros to a multiple of 64 (whole blocks of the layout,
    which the one-row kernel reads); ``int4_matmul`` drops the padding from its result."""
    n, k = weight.shape
    rows = -(-n // 64) * 64
    if rows != n:
        weight = torch.cat([weight, weight.new_zeros(rows - n, k)])
    q, scales_and_zeros = _int4_groups(weight, group_size)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INT4_INNER_K_TILES)
    return packed, scales_and_zeros.to(weight.dtype)


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ dequantized(q).T`` for ``x`` of any leading shape (one row: ``one_row``'s kernel)."""
    if one_row.applies(x, q.shape[0], "int8") and scale.dtype == torch.float32:
        return one_row.int8(x, q, scale)
    flat = x.reshape(-1, x.shape[-1])
    return torch.ops.aten._weight_int8pack_mm(flat, q, scale).reshape(*x.shape[:-1], q.shape[0])


def int4_matmul(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, out_features: int
) -> torch.Tensor:
    """``x @ dequantized.T`` on the packed int4 weight (the CPU layout or the CUDA one), without
    the padding rows."""
    rows = scales_and_zeros.shape[1]
    if one_row.applies(x, rows, "int4") and scales_and_zeros.dtype == torch.float32:
        out = one_row.int4(x, packed, scales_and_zeros, group_size)
    else:
        flat = x.reshape(-1, x.shape[-1])
        if packed.device.type == "cpu":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, packed, group_size, scales_and_zeros)
        else:
            out = torch.ops.aten._weight_int4pack_mm(flat, packed, group_size, scales_and_zeros)
        out = out.reshape(*x.shape[:-1], rows)
    return out if rows == out_features else out[..., :out_features].contiguous()


def _int4_groups(weight: torch.Tensor, group_size: int):
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)
    low = groups.amin(dim=-1, keepdim=True)
    high = groups.amax(dim=-1, keepdim=True)
    scale = (high - low).clamp_min(1e-6) / 15
    q = torch.clamp(torch.round((groups - low) / scale), 0, 15).to(torch.int32).reshape(n, k)
    zero = low + 8 * scale
    scales_and_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1).transpose(0, 1).contiguous()
    return q, scales_and_zeros


@torch.no_grad()
def quantize_int4_cuda(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CUDA layout: two values per byte (even input features in the high nibble) converted
    by ``_convert_weight_to_int4pack``; bfloat16 scales and zeros. ``check_int4_cuda`` verifies it."""
    q, scales_and_zeros = _int4_groups(weight, group_size)
    k = weight.shape[1]
    inner_k_tiles = 8 if k % 128 == 0 else 4 if k % 64 == 0 else 2
    pairs = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), inner_k_tiles)
    return packed, scales_and_zeros.to(torch.bfloat16)


@torch.no_grad()
def check_int4_cuda(weight: torch.Tensor, packed, scales_and_zeros, group_size: int) -> bool:
    """The CUDA kernel applied to the identity gives the dequantized weight (a packing mistake
    would otherwise be a silent wrong result)."""
    q, sz = _int4_groups(weight, group_size)
    n, k = weight.shape
    expected = ((q.reshape(n, k // group_size, group_size).float() - 8) * sz[..., 0].t()[..., None]
                + sz[..., 1].t()[..., None]).reshape(n, k)  # fmt: skip
    got = dequantize_int4(packed, scales_and_zeros, group_size, (n, k)).float()
    return bool(torch.allclose(got, expected.to(torch.bfloat16).float(), rtol=2e-2, atol=2e-2))


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.to(scale.dtype) * scale[:, None]


def dequantize_int4(
    packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, weight_shape: tuple
):
    """The float weight ``[N, K]``: the kernel applied to the identity (exact for any packing layout)."""
    out_features, in_features = weight_shape
    eye = torch.eye(in_features, dtype=scales_and_zeros.dtype, device=packed.device)
    return int4_matmul(eye, packed, scales_and_zeros, group_size, out_features).t().contiguous()
