"""Which linear calls TransformerEngine takes (pure logic on proxies)."""

from __future__ import annotations

import math

import torch

from thunder_core import Rejection

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def linear_checker(capability: tuple[int, int], fp8: bool):
    def check(x, weight, bias=None):
        if x.device.type != "cuda" or weight.device.type != "cuda":
            return Rejection("TransformerEngine runs CUDA tensors")
        if x.dtype not in DTYPES or weight.dtype != x.dtype:
            return Rejection(
                "TransformerEngine linear takes float32/float16/bfloat16 input and weight of one dtype"
            )
        if weight.ndim != 2:
            return Rejection("the weight must be 2-d (out_features, in_features)")
        if fp8:
            if capability < (8, 9):
                return Rejection(
                    f"FP8 needs compute capability 8.9+, this device has {capability[0]}.{capability[1]}"
                )
            out_features, in_features = weight.shape
            if in_features % 16 or out_features % 16:
                return Rejection(
                    f"FP8 GEMMs need in/out features divisible by 16 (got {in_features}, {out_features})"
                )
            tokens = math.prod(x.shape[:-1])
            if tokens % 8:
                return Rejection(f"FP8 GEMMs need the flattened batch divisible by 8 (got {tokens})")
        return True

    return check
