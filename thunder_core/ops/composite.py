"""Composite torch ops real models use, decomposed into other torch-level ops.

BLAS-style fused ops (``addmm`` — HF GPT-2's Conv1D —, ``baddbmm``, ``addmv``, ``addr``,
``addcmul``, ``addcdiv``), ``diff``, activations, losses and constant padding. Each
decomposition calls torch-level symbols, which record their own decompositions into prims,
so fusion executors see the elementwise work and autodiff uses the existing rules. A call
form a decomposition does not cover raises ``NoDecomposition`` and the op stays a leaf
run by the torch executor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from thunder_core.ir.symbolic import same_sizes
from thunder_core.ops import creation, elementwise, nn, reductions, shapes  # noqa: F401  (the ops used here)
from thunder_core.ops._helpers import LOW_PRECISION, NoDecomposition, convert, in_float32, is_tensor
from thunder_core.ops.registry import TORCH_SYMBOLS, register_torch_op

T = torch.Tensor


def op(name: str):
    return TORCH_SYMBOLS[name]


def _scaled(x, factor):
    return x if factor == 1 else op("mul")(x, factor)


def _beta_input(input, beta):
    if beta == 0:
        raise NoDecomposition  # beta=0 ignores NaN/inf in input: leave it to the kernel
    return _scaled(input, beta)


def _add_product(product):
    def decomposition(input, a, b, *, beta=1, alpha=1, out=None):
        if out is not None or not all(is_tensor(x) for x in (input, a, b)):
            raise NoDecomposition
        if a.dtype in LOW_PRECISION:
            raise NoDecomposition  # eager rounds the sum once, not the product first (see nn._linear)
        result = op("add")(_beta_input(input, beta), _scaled(product(a, b), alpha))
        if result.dtype != input.dtype:
            raise NoDecomposition
        return result

    return decomposition


def _outer(a, b):
    return op("mul")(op("unsqueeze")(a, 1), op("unsqueeze")(b, 0))


register_torch_op("addmm", torch.addmm, T.addmm, decomposition=_add_product(op("matmul")))
register_torch_op("baddbmm", torch.baddbmm, T.baddbmm, decomposition=_add_product(op("matmul")))
register_torch_op("addmv", torch.addmv, T.addmv, decomposition=_add_product(op("matmul")))
register_torch_op("addr", torch.addr, T.addr, decomposition=_add_product(_outer))
register_torch_op("mv", torch.mv, T.mv, decomposition=lambda a, b: op("matmul")(a, b))
register_torch_op("outer", torch.outer, T.outer, torch.ger, T.ger, decomposition=_outer)


def _addc(combine):
    def decomposition(input, a, b, *, value=1, out=None):
        if out is not None:
            raise NoDecomposition
        if not all(is_tensor(x) for x in (input, a, b)):
            return op("add")(input, _scaled(combine(a, b), value))
        dtype = torch.promote_types(torch.promote_types(input.dtype, a.dtype), b.dtype)
        # Eager's kernel computes in the common dtype (float16/bfloat16 in float32) and rounds once.
        compute = torch.float32 if dtype in LOW_PRECISION else dtype
        input, a, b = (convert(x, compute) for x in (input, a, b))
        return convert(op("add")(input, _scaled(combine(a, b), value)), dtype)

    return decomposition


register_torch_op("addcmul", torch.addcmul, T.addcmul, decomposition=_addc(lambda a, b: op("mul")(a, b)))
register_torch_op("addcdiv", torch.addcdiv, T.addcdiv, decomposition=_addc(lambda a, b: op("div")(a, b)))


def _diff(input, n=1, dim=-1, prepend=None, append=None):
    if prepend is not None or append is not None or n < 0:
        raise NoDecomposition
    out = input
    for _ in range(n):
        length = out.shape[dim]
        if length == 0:
            raise NoDecomposition
        later, earlier = op("narrow")(out, dim, 1, length - 1), op("narrow")(out, dim, 0, length - 1)
        out = op("logical_xor")(later, earlier) if out.dtype == torch.bool else op("sub")(later, earlier)
    return out


register_torch_op("diff", torch.diff, T.diff, decomposition=_diff)


def _clamp_bound(which):
    def decomposition(input, bound):
        return op("clamp")(input, **{which: bound})

    return decomposition


register_torch_op("clamp_min", torch.clamp_min, T.clamp_min, decomposition=_clamp_bound("min"))
register_torch_op("clamp_max", torch.clamp_max, T.clamp_max, decomposition=_clamp_bound("max"))


# Activations.
def _float_only(x):
    if not is_tensor(x) or not x.dtype.is_floating_point:
        raise NoDecomposition


def _leaky_relu(input, negative_slope=0.01, inplace=False):
    _float_only(input)
    if inplace:
        raise NoDecomposition
    return op("where")(op("gt")(input, 0), input, op("mul")(input, negative_slope))


def _hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    _float_only(input)
    if inplace:
        raise NoDecomposition
    return op("clamp")(input, min_val, max_val)


def _relu6(input, inplace=False):
    return _hardtanh(input, 0.0, 6.0, inplace)


def _hardsigmoid(input, inplace=False):
    _float_only(input)
    if inplace:
        raise NoDecomposition
    return op("div")(op("clamp")(op("add")(input, 3.0), 0.0, 6.0), 6.0)


def _hardswish(input, inplace=False):
    return op("mul")(input, _hardsigmoid(input, inplace))


def _elu(input, alpha=1.0, inplace=False):
    _float_only(input)
    if inplace:
        raise NoDecomposition
    return op("where")(op("gt")(input, 0), input, op("mul")(op("expm1")(input), alpha))


def _celu(input, alpha=1.0, inplace=False):
    _float_only(input)
    if inplace:
        raise NoDecomposition
    return op("where")(op("gt")(input, 0), input, op("mul")(op("expm1")(op("div")(input, alpha)), alpha))


def _selu(input, inplace=False):
    scale, alpha = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
    return op("mul")(_elu(input, alpha, inplace), scale)


def _softplus(input, beta=1.0, threshold=20.0):
    _float_only(input)
    scaled = op("mul")(input, beta)
    soft = op("div")(op("log1p")(op("exp")(scaled)), beta)
    return op("where")(op("gt")(scaled, threshold), input, soft)


def _mish(input, inplace=False):
    if inplace:
        raise NoDecomposition
    return op("mul")(input, op("tanh")(_softplus(input)))


def _logsigmoid(input):
    _float_only(input)
    return op("neg")(_softplus(op("neg")(input)))


def _softsign(input):
    _float_only(input)
    return op("div")(input, op("add")(op("abs")(input), 1))


def _tanhshrink(input):
    _float_only(input)
    return op("sub")(input, op("tanh")(input))


def _threshold(input, threshold, value, inplace=False):
    _float_only(input)
    if inplace:
        raise NoDecomposition
    return op("where")(op("gt")(input, threshold), input, op("full_like")(input, value))


def _glu(input, dim=-1):
    _float_only(input)
    first, second = op("chunk")(input, 2, dim)
    return op("mul")(first, op("sigmoid")(second))


def _softmin(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        raise NoDecomposition
    return op("softmax")(op("neg")(input), dim, dtype=dtype)


def _as_one_kernel(decomposition):
    """Eager runs the activation as one kernel, which computes float16/bfloat16 in float32 and
    rounds once: so does its decomposition (rounded after each operation, as a fusion executor
    that emulates eager's separate kernels computes it, it is several units in the last place away)."""

    def rounded_once(input, *args, **kwargs):
        if not is_tensor(input) or input.dtype not in LOW_PRECISION:
            return decomposition(input, *args, **kwargs)
        return convert(decomposition(in_float32(input), *args, **kwargs), input.dtype)

    return rounded_once


_ONE_KERNEL = frozenset({"leaky_relu", "hardsigmoid", "hardswish", "elu", "celu", "selu", "softplus", "mish",
                         "logsigmoid", "glu", "threshold"})  # fmt: skip

for _name, _fn, _decomposition in (
    ("leaky_relu", F.leaky_relu, _leaky_relu),
    ("hardtanh", F.hardtanh, _hardtanh),
    ("relu6", F.relu6, _relu6),
    ("hardsigmoid", F.hardsigmoid, _hardsigmoid),
    ("hardswish", F.hardswish, _hardswish),
    ("elu", F.elu, _elu),
    ("celu", F.celu, _celu),
    ("selu", F.selu, _selu),
    ("softplus", F.softplus, _softplus),
    ("mish", F.mish, _mish),
    ("logsigmoid", F.logsigmoid, _logsigmoid),
    ("softsign", F.softsign, _softsign),
    ("tanhshrink", F.tanhshrink, _tanhshrink),
    ("threshold", F.threshold, _threshold),
    ("glu", F.glu, _glu),
    ("softmin", F.softmin, _softmin),
):
    register_torch_op(
        _name, _fn, decomposition=_as_one_kernel(_decomposition) if _name in _ONE_KERNEL else _decomposition
    )


# Losses.
def _reduce(loss, reduction: str):
    if reduction == "mean":
        return op("mean")(loss)
    if reduction == "sum":
        return op("sum")(loss)
    if reduction == "none":
        return loss
    raise NoDecomposition


def _pointwise_loss(distance):
    def decomposition(input, target, *args, reduction="mean", **kwargs):
        if args or kwargs.get("size_average") is not None or kwargs.get("reduce") is not None:
            raise NoDecomposition
        if not (is_tensor(input) and is_tensor(target)) or not same_sizes(input.shape, target.shape):
            raise NoDecomposition
        if kwargs.get("weight") is not None:
            raise NoDecomposition
        extra = {k: v for k, v in kwargs.items() if k not in ("size_average", "reduce", "weight")}
        return _reduce(distance(input, target, **extra), reduction)

    return decomposition


def _squared(input, target):
    difference = op("sub")(input, target)
    return op("mul")(difference, difference)


def _absolute(input, target):
    return op("abs")(op("sub")(input, target))


def _smooth_l1(input, target, beta=1.0):
    if beta == 0:
        return _absolute(input, target)
    absolute = _absolute(input, target)
    quadratic = op("div")(op("mul")(op("mul")(absolute, absolute), 0.5), beta)
    return op("where")(op("lt")(absolute, beta), quadratic, op("sub")(absolute, 0.5 * beta))


def _huber(input, target, delta=1.0):
    absolute = _absolute(input, target)
    quadratic = op("mul")(op("mul")(absolute, absolute), 0.5)
    return op("where")(
        op("lt")(absolute, delta), quadratic, op("mul")(op("sub")(absolute, 0.5 * delta), delta)
    )


def _bce_with_logits(input, target, weight=None, pos_weight=None):
    if weight is not None or pos_weight is not None:
        raise NoDecomposition
    # (1 - t) * x + log(1 + exp(-x)), written stably as (1 - t) * x - logsigmoid(x)
    return op("sub")(op("mul")(op("rsub")(target, 1), input), _logsigmoid(input))


register_torch_op("mse_loss", F.mse_loss, decomposition=_pointwise_loss(_squared))
register_torch_op("l1_loss", F.l1_loss, decomposition=_pointwise_loss(_absolute))
register_torch_op("smooth_l1_loss", F.smooth_l1_loss, decomposition=_pointwise_loss(_smooth_l1))
register_torch_op("huber_loss", F.huber_loss, decomposition=_pointwise_loss(_huber))
register_torch_op(
    "binary_cross_entropy_with_logits",
    F.binary_cross_entropy_with_logits,
    decomposition=_pointwise_loss(_bce_with_logits),
)


# Padding.
def _pad(input, pad, mode="constant", value=None):
    if mode != "constant" or any(p < 0 for p in pad) or len(pad) % 2:
        raise NoDecomposition
    out = input
    fill = 0 if value is None else value
    for i in range(len(pad) // 2):
        dim = input.ndim - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        parts = []
        for width in (before, after):
            shape = list(out.shape)
            shape[dim] = width
            parts.append(op("full")(shape, fill, dtype=out.dtype, device=out.device) if width else None)
        pieces = [p for p in (parts[0], out, parts[1]) if p is not None]
        out = op("cat")(pieces, dim) if len(pieces) > 1 else out
    if out is input:
        out = op("clone")(input)
    return out


register_torch_op("pad", F.pad, decomposition=_pad)
