"""Prims: the small set of primitive operations that torch-level ops decompose into.

Each prim's ``impl`` is its reference meaning in eager PyTorch; fusion executors claim
prims and translate them. Conventions: elementwise prims take tensors of one shape and
dtype (Python numbers allowed) -- torch-level decompositions insert the type promotion
(``convert_element_type``) and broadcasting (``broadcast_in_dim``) explicitly; reductions
take a tuple of dims and keep the input dtype.
"""

from __future__ import annotations

import builtins
import sys

import torch

from thunder_core.ir.codegen import register_named_module
from thunder_core.ir.symbols import RANDOM, Symbol

PRIMS: dict[str, Symbol] = {}


def _prim(name: str, impl, *, tags=()) -> Symbol:
    symbol = Symbol(name=name, impl=impl, printed_name=f"prims.{name}", is_prim=True, tags=frozenset(tags))
    PRIMS[name] = symbol
    return symbol


# Elementwise unary.
abs = _prim("abs", torch.abs)
neg = _prim("neg", torch.neg)
exp = _prim("exp", torch.exp)
exp2 = _prim("exp2", torch.exp2)
expm1 = _prim("expm1", torch.expm1)
log = _prim("log", torch.log)
log1p = _prim("log1p", torch.log1p)
log2 = _prim("log2", torch.log2)
log10 = _prim("log10", torch.log10)
sin = _prim("sin", torch.sin)
cos = _prim("cos", torch.cos)
tan = _prim("tan", torch.tan)
asin = _prim("asin", torch.asin)
acos = _prim("acos", torch.acos)
atan = _prim("atan", torch.atan)
sinh = _prim("sinh", torch.sinh)
cosh = _prim("cosh", torch.cosh)
tanh = _prim("tanh", torch.tanh)
asinh = _prim("asinh", torch.asinh)
acosh = _prim("acosh", torch.acosh)
atanh = _prim("atanh", torch.atanh)
sqrt = _prim("sqrt", torch.sqrt)
rsqrt = _prim("rsqrt", torch.rsqrt)
reciprocal = _prim("reciprocal", torch.reciprocal)
erf = _prim("erf", torch.erf)
erfc = _prim("erfc", torch.erfc)
erfinv = _prim("erfinv", torch.erfinv)
floor = _prim("floor", torch.floor)
ceil = _prim("ceil", torch.ceil)
round = _prim("round", torch.round)
trunc = _prim("trunc", torch.trunc)
sign = _prim("sign", torch.sign)
signbit = _prim("signbit", torch.signbit)
isnan = _prim("isnan", torch.isnan)
isinf = _prim("isinf", torch.isinf)
isfinite = _prim("isfinite", torch.isfinite)
logical_not = _prim("logical_not", torch.logical_not)
bitwise_not = _prim("bitwise_not", torch.bitwise_not)
lgamma = _prim("lgamma", torch.lgamma)
digamma = _prim("digamma", torch.digamma)
sigmoid = _prim("sigmoid", torch.sigmoid)

# Elementwise binary.
add = _prim("add", torch.add)
sub = _prim("sub", torch.sub)
mul = _prim("mul", torch.mul)
div = _prim("div", torch.true_divide)
remainder = _prim("remainder", torch.remainder)
fmod = _prim("fmod", torch.fmod)
pow = _prim("pow", torch.pow)
maximum = _prim("maximum", torch.maximum)
minimum = _prim("minimum", torch.minimum)
atan2 = _prim("atan2", torch.atan2)
eq = _prim("eq", torch.eq)
ne = _prim("ne", torch.ne)
lt = _prim("lt", torch.lt)
le = _prim("le", torch.le)
gt = _prim("gt", torch.gt)
ge = _prim("ge", torch.ge)
bitwise_and = _prim("bitwise_and", torch.bitwise_and)
bitwise_or = _prim("bitwise_or", torch.bitwise_or)
bitwise_xor = _prim("bitwise_xor", torch.bitwise_xor)
shift_left = _prim("shift_left", torch.bitwise_left_shift)
shift_right = _prim("shift_right", torch.bitwise_right_shift)
copysign = _prim("copysign", torch.copysign)

# Elementwise ternary.
where = _prim("where", torch.where)


def _convert_element_type(a, dtype):
    return a.to(dtype)


convert_element_type = _prim("convert_element_type", _convert_element_type)


def _device_put(a, device):
    return a.to(device)


device_put = _prim("device_put", _device_put)


# Shapes.
def _broadcast_in_dim(a, shape, broadcast_dims):
    view = [1] * len(shape)
    for input_dim, output_dim in enumerate(broadcast_dims):
        view[output_dim] = a.shape[input_dim]
    return a.reshape(view).expand(shape)


broadcast_in_dim = _prim("broadcast_in_dim", _broadcast_in_dim)
reshape = _prim("reshape", torch.reshape)
permute = _prim("permute", torch.permute)


def _slice(a, start_indices, end_indices, strides=None):
    strides = strides or [1] * len(start_indices)
    return a[tuple(builtins.slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides))]


slice = _prim("slice", _slice)


def _squeeze(a, dims):
    return a.squeeze(tuple(dims)) if dims else a.view(a.shape)


squeeze = _prim("squeeze", _squeeze)
cat = _prim("cat", torch.cat)
flip = _prim("flip", torch.flip)


# Reductions over a tuple of dims, keeping the input dtype.
def _sum(a, dims):
    return torch.sum(a, dims, dtype=a.dtype) if dims else a.clone()


def _prod(a, dims):
    for dim in sorted(dims, reverse=True):
        a = torch.prod(a, dim, dtype=a.dtype)
    return a


def _amax(a, dims):
    return torch.amax(a, dims) if dims else a.clone()


def _amin(a, dims):
    return torch.amin(a, dims) if dims else a.clone()


def _var(a, dims, correction):
    return torch.var(a, dims, correction=correction)


sum = _prim("sum", _sum)
prod = _prim("prod", _prod)
amax = _prim("amax", _amax)
amin = _prim("amin", _amin)
var = _prim("var", _var)
argmax = _prim("argmax", torch.argmax)
argmin = _prim("argmin", torch.argmin)
cumsum = _prim("cumsum", lambda a, dim: torch.cumsum(a, dim, dtype=a.dtype))
topk = _prim("topk", torch.topk)

# Indexing.
take = _prim("take", lambda a, index, dim: torch.index_select(a, dim, index))
index = _prim("index", lambda a, indices: a[tuple(indices)])
gather = _prim("gather", torch.gather)
scatter = _prim("scatter", torch.scatter)
scatter_add = _prim("scatter_add", torch.scatter_add)

# Linear algebra.
matmul = _prim("matmul", torch.matmul)


# Creation.
def _full(shape, fill_value, dtype, device):
    return torch.full(tuple(shape), fill_value, dtype=dtype, device=device)


def _iota(length, start, step, dtype, device):
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.arange(length, dtype=torch.float64, device=device) * step + start).to(dtype)
    return torch.arange(start, start + length * step, step, dtype=dtype, device=device)[:length]


def _uniform(shape, low, high, dtype, device):
    return torch.empty(tuple(shape), dtype=dtype, device=device).uniform_(low, high)


full = _prim("full", _full)
iota = _prim("iota", _iota)
uniform = _prim("uniform", _uniform, tags=(RANDOM,))


register_named_module("prims", sys.modules[__name__], "from thunder_core.ops import prims")
