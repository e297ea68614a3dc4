"""Elementwise torch ops: unary, binary and ternary, with PyTorch's promotion and broadcasting."""

from __future__ import annotations

import math

import torch

from thunder_core.ops import prims
from thunder_core.ops._helpers import (
    Kind,
    NoDecomposition,
    broadcast_to,
    convert,
    is_tensor,
    promote,
    shape_of_broadcast,
)
from thunder_core.ops.registry import register_torch_op, swap_first_two

T = torch.Tensor
S = torch.special


def _unary(prim, kind):
    def decomposition(a, *, out=None):
        if out is not None:
            raise NoDecomposition
        computation, result = promote(a, kind=kind)
        return convert(prim(convert(a, computation)), result)

    return decomposition


def _aliases(name: str, extra=()):
    found = [getattr(T, name, None), getattr(T, f"__{name}__", None), getattr(S, name, None), *extra]
    return [fn for fn in found if fn is not None]


_UNARY = {
    Kind.INT_TO_FLOAT: [
        "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos",
        "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "reciprocal", "erf",
        "erfc", "erfinv", "sigmoid", "lgamma", "digamma",
    ],
    Kind.DEFAULT: ["neg", "floor", "ceil", "trunc", "sign", "bitwise_not"],
    Kind.COMPLEX_TO_FLOAT: ["abs"],
    Kind.ALWAYS_BOOL: ["isnan", "isinf", "isfinite", "signbit", "logical_not"],
}  # fmt: skip

for _kind, _names in _UNARY.items():
    for _name in _names:
        _extra = []
        if _name in ("tanh", "sigmoid"):
            _extra.append(getattr(torch.nn.functional, _name))
        if _name == "abs":
            _extra += [torch.absolute, T.absolute]
        if _name == "neg":
            _extra += [torch.negative, T.negative]
        if _name == "bitwise_not":
            _extra.append(T.__invert__)
        if _name == "asin":
            _extra += [torch.arcsin]
        if _name == "atan":
            _extra += [torch.arctan]
        register_torch_op(
            _name,
            getattr(torch, _name),
            *_aliases(_name, _extra),
            decomposition=_unary(getattr(prims, _name), _kind),
        )


def _round_decomposition(a, *, decimals=0):
    if decimals != 0:
        raise NoDecomposition
    return prims.round(a)


register_torch_op("round", torch.round, T.round, decomposition=_round_decomposition)


def _binary(prim, kind):
    def decomposition(a, b, *, out=None):
        if out is not None:
            raise NoDecomposition
        computation, result = promote(a, b, kind=kind)
        shape = shape_of_broadcast(a, b)
        a, b = (broadcast_to(convert(x, computation), shape) for x in (a, b))
        return convert(prim(a, b), result)

    return decomposition


def _with_alpha(prim):
    def decomposition(a, b, *, alpha=None, out=None):
        if out is not None:
            raise NoDecomposition
        computation, result = promote(a, b, kind=Kind.DEFAULT)
        shape = shape_of_broadcast(a, b)
        a, b = (broadcast_to(convert(x, computation), shape) for x in (a, b))
        if alpha is not None and alpha != 1:
            b = prims.mul(b, alpha)
        return convert(prim(a, b), result)

    return decomposition


register_torch_op(
    "add", torch.add, T.add, T.__add__, (T.__radd__, swap_first_two), decomposition=_with_alpha(prims.add)
)
register_torch_op("sub", torch.sub, T.sub, T.__sub__, torch.subtract, decomposition=_with_alpha(prims.sub))


def _rsub(a, b, *, alpha=None):
    return _with_alpha(prims.sub)(b, a, alpha=alpha)


register_torch_op("rsub", torch.rsub, T.__rsub__, decomposition=_rsub)
register_torch_op(
    "mul",
    torch.mul,
    T.mul,
    T.__mul__,
    torch.multiply,
    (T.__rmul__, swap_first_two),
    decomposition=_binary(prims.mul, Kind.DEFAULT),
)


def _div(a, b, *, rounding_mode=None, out=None):
    if out is not None:
        raise NoDecomposition
    if rounding_mode is None:
        return _binary(prims.div, Kind.INT_TO_FLOAT)(a, b)
    computation, result = promote(a, b, kind=Kind.DEFAULT)
    if not (computation.is_floating_point):
        raise NoDecomposition  # integer floor/trunc division keeps torch's kernel
    shape = shape_of_broadcast(a, b)
    a, b = (broadcast_to(convert(x, computation), shape) for x in (a, b))
    quotient = prims.div(a, b)
    rounded = prims.trunc(quotient) if rounding_mode == "trunc" else prims.floor(quotient)
    return convert(rounded, result)


register_torch_op(
    "div",
    torch.div,
    T.div,
    T.__truediv__,
    torch.true_divide,
    T.true_divide,
    torch.divide,
    (T.__rtruediv__, swap_first_two),
    decomposition=_div,
)

_BINARY = {
    "remainder": (prims.remainder, Kind.DEFAULT, [T.__mod__]),
    "fmod": (prims.fmod, Kind.DEFAULT, []),
    "maximum": (prims.maximum, Kind.DEFAULT, []),
    "minimum": (prims.minimum, Kind.DEFAULT, []),
    "atan2": (prims.atan2, Kind.INT_TO_FLOAT, [torch.arctan2]),
    "eq": (prims.eq, Kind.ALWAYS_BOOL, [T.__eq__]),
    "ne": (prims.ne, Kind.ALWAYS_BOOL, [T.__ne__, torch.not_equal]),
    "lt": (prims.lt, Kind.ALWAYS_BOOL, [T.__lt__, torch.less]),
    "le": (prims.le, Kind.ALWAYS_BOOL, [T.__le__, torch.less_equal]),
    "gt": (prims.gt, Kind.ALWAYS_BOOL, [T.__gt__, torch.greater]),
    "ge": (prims.ge, Kind.ALWAYS_BOOL, [T.__ge__, torch.greater_equal]),
    "bitwise_and": (prims.bitwise_and, Kind.DEFAULT, [T.__and__, (T.__rand__, swap_first_two)]),
    "bitwise_or": (prims.bitwise_or, Kind.DEFAULT, [T.__or__, (T.__ror__, swap_first_two)]),
    "bitwise_xor": (prims.bitwise_xor, Kind.DEFAULT, [T.__xor__, (T.__rxor__, swap_first_two)]),
    "bitwise_left_shift": (prims.shift_left, Kind.DEFAULT, [T.__lshift__]),
    "bitwise_right_shift": (prims.shift_right, Kind.DEFAULT, [T.__rshift__]),
    "copysign": (prims.copysign, Kind.INT_TO_FLOAT, []),
}
for _name, (_prim, _kind, _extra) in _BINARY.items():
    _method = getattr(T, _name, None)
    register_torch_op(
        _name,
        getattr(torch, _name),
        *([_method] if _method is not None else []),
        *_extra,
        decomposition=_binary(_prim, _kind),
    )


def _pow(a, b, *, out=None):
    if out is not None:
        raise NoDecomposition
    if is_tensor(a) and not is_tensor(b) and b == 2:
        computation, result = promote(a, b, kind=Kind.DEFAULT)
        a = convert(a, computation)
        return convert(prims.mul(a, a), result)
    return _binary(prims.pow, Kind.DEFAULT)(a, b)


register_torch_op("pow", torch.pow, T.pow, T.__pow__, (T.__rpow__, swap_first_two), decomposition=_pow)


def _logical(prim):
    def decomposition(a, b, *, out=None):
        shape = shape_of_broadcast(a, b)
        a, b = (broadcast_to(convert(x, torch.bool), shape) for x in (a, b))
        return prim(a, b)

    return decomposition


register_torch_op("logical_and", torch.logical_and, T.logical_and, decomposition=_logical(prims.bitwise_and))
register_torch_op("logical_or", torch.logical_or, T.logical_or, decomposition=_logical(prims.bitwise_or))
register_torch_op("logical_xor", torch.logical_xor, T.logical_xor, decomposition=_logical(prims.bitwise_xor))


def _where(condition, a=None, b=None):
    if a is None or b is None:
        raise NoDecomposition
    computation, result = promote(a, b, kind=Kind.NO_OPMATH)
    shape = shape_of_broadcast(condition, a, b)
    condition = broadcast_to(convert(condition, torch.bool), shape)
    a, b = (broadcast_to(convert(x, result), shape) for x in (a, b))
    return prims.where(condition, a, b)


register_torch_op("where", torch.where, T.where, decomposition=_where)


def _masked_fill(a, mask, value):
    shape = tuple(a.shape)
    mask = broadcast_to(mask, shape)
    if is_tensor(value):
        value = broadcast_to(convert(value, a.dtype), shape)
    elif not a.dtype.is_floating_point and not a.dtype.is_complex and isinstance(value, float):
        raise NoDecomposition
    return prims.where(mask, value, a)


register_torch_op("masked_fill", torch.masked_fill, T.masked_fill, decomposition=_masked_fill)


def _clamp(a, min=None, max=None):
    if min is None and max is None:
        raise NoDecomposition
    computation, result = promote(a, *(x for x in (min, max) if x is not None), kind=Kind.DEFAULT)
    shape = shape_of_broadcast(a, *(x for x in (min, max) if x is not None))
    out = broadcast_to(convert(a, computation), shape)
    if min is not None:
        low = broadcast_to(convert(min, computation), shape)
        # torch.clamp propagates NaN from the input: where(a < min, min, a) does too.
        out = prims.where(prims.lt(out, low), low, out)
    if max is not None:
        high = broadcast_to(convert(max, computation), shape)
        out = prims.where(prims.gt(out, high), high, out)
    return convert(out, result)


register_torch_op("clamp", torch.clamp, T.clamp, torch.clip, T.clip, decomposition=_clamp)


# Activations.
def _relu(a, inplace=False):
    if inplace:
        raise NoDecomposition
    return prims.where(prims.le(a, 0), 0, a)


register_torch_op("relu", torch.nn.functional.relu, torch.relu, T.relu, decomposition=_relu)


def _gelu(a, approximate="none"):
    computation, result = promote(a, kind=Kind.INT_TO_FLOAT)
    x = convert(a, computation)
    if approximate == "tanh":
        inner = prims.mul(
            prims.add(x, prims.mul(prims.mul(prims.mul(x, x), x), 0.044715)), math.sqrt(2 / math.pi)
        )
        out = prims.mul(prims.mul(x, 0.5), prims.add(prims.tanh(inner), 1.0))
    else:
        out = prims.mul(prims.mul(x, 0.5), prims.add(prims.erf(prims.mul(x, 1 / math.sqrt(2))), 1.0))
    return convert(out, result)


register_torch_op("gelu", torch.nn.functional.gelu, decomposition=_gelu)


def _silu(a, inplace=False):
    if inplace:
        raise NoDecomposition
    computation, result = promote(a, kind=Kind.INT_TO_FLOAT)
    x = convert(a, computation)
    return convert(prims.mul(x, prims.sigmoid(x)), result)


register_torch_op("silu", torch.nn.functional.silu, decomposition=_silu)


def _square(a):
    return _pow(a, 2)


register_torch_op("square", torch.square, T.square, decomposition=_square)
