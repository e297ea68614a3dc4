"""Which operations run in lower precision, which in float32: torch.autocast's own lists.

Taken from PyTorch's autocast policy (``aten/src/ATen/autocast_mode.cpp``) for the CPU and
CUDA device types. Operations not listed run in the dtypes their inputs arrive in.
``cast_inputs`` applies the policy to one operation's arguments: capture does so for every
operation recorded while ``torch.autocast`` is on, the autocast transform for every operation
of a trace.
"""

from __future__ import annotations

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.tree import leaves, tree_map

LOWER, FLOAT32, PROMOTE = "lower_precision", "float32", "promote"

_CPU_LOWER = {
    "conv1d",
    "conv2d",
    "conv3d",
    "bmm",
    "mm",
    "linalg_vecdot",
    "baddbmm",
    "addmm",
    "addbmm",
    "linear",
    "matmul",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "prelu",
    "scaled_dot_product_attention",
}
_CPU_FLOAT32 = {
    "avg_pool3d",
    "binary_cross_entropy",
    "grid_sampler",
    "polar",
    "prod",
    "quantile",
    "nanquantile",
    "stft",
    "cdist",
    "trace",
    "view_as_complex",
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "inverse",
    "lu_solve",
    "orgqr",
    "ormqr",
    "pinverse",
    "max_pool3d",
    "max_unpool2d",
    "max_unpool3d",
    "adaptive_avg_pool3d",
    "reflection_pad1d",
    "reflection_pad2d",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    "mse_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "poisson_nll_loss",
    "smooth_l1_loss",
    "cross_entropy",
    "l1_loss",
    "huber_loss",
    "margin_ranking_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "ctc_loss",
    "kl_div",
    "multilabel_margin_loss",
    "binary_cross_entropy_with_logits",
}
_CUDA_LOWER = {
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "scaled_dot_product_attention",
}
_CUDA_FLOAT32 = {
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "softplus",
    "layer_norm",
    "group_norm",
    "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "softmax",
    "log_softmax",
    "prod",
    "sum",
    "cumprod",
    "cumsum",
    "norm",
    "cross_entropy",
    "rms_norm",
}
_PROMOTE = {"stack", "cat", "index_copy"}  # fmt: skip

POLICIES = {"cpu": (_CPU_LOWER, _CPU_FLOAT32), "cuda": (_CUDA_LOWER, _CUDA_FLOAT32)}
DEVICE_TYPES = tuple(POLICIES)  # the device types autocast is followed on


def policy(op_name: str, device_type: str) -> str | None:
    """LOWER, FLOAT32, PROMOTE or None for an op (its last name component) on a device type."""
    short = op_name.rsplit(".", 1)[-1]
    lower, float32 = POLICIES.get(device_type, (set(), set()))
    if short in lower:
        return LOWER
    if short in float32:
        return FLOAT32
    if short in _PROMOTE:
        return PROMOTE
    return None


def cast_inputs(op_name: str, device_type: str, dtype: torch.dtype, args: tuple, kwargs: dict) -> tuple:
    """``(args, kwargs)`` with the casts autocast to ``dtype`` makes before ``op_name`` on
    ``device_type``, each a recorded ``to`` call; unchanged for an op autocast leaves alone."""
    rule = policy(op_name, device_type)
    if rule is None:
        return args, kwargs
    if rule == PROMOTE:
        floats = [x.dtype for x in leaves((args, kwargs)) if _eligible(x)]
        if not floats:
            return args, kwargs
        dtype = max(floats, key=lambda d: torch.finfo(d).bits)
    elif rule == FLOAT32:
        dtype = torch.float32
    cast = _cast(dtype)
    return tree_map(cast, args), tree_map(cast, kwargs)


def _cast(dtype: torch.dtype):
    from thunder_core.ops import TORCH_SYMBOLS  # the registry imports this module's users

    to = TORCH_SYMBOLS["to"]

    def cast(x):
        if _eligible(x) and x.dtype != dtype:
            return to(x, dtype)
        return x

    return cast


def _eligible(x) -> bool:
    """What autocast casts: floating-point tensors other than float64 (autocast leaves those)."""
    return isinstance(x, TensorProxy) and x.dtype.is_floating_point and x.dtype != torch.float64


def proxy_device_type(args, kwargs) -> str | None:
    """The device type of the first tensor among an operation's arguments."""
    for x in leaves((args, kwargs)):
        if isinstance(x, TensorProxy):
            return x.device.type
    return None
