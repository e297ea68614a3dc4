"""VJP rules for prims, used when a torch-level op is differentiated through its decomposition."""

from __future__ import annotations

import builtins
import math

from thunder_core.autodiff import kernels as K
from thunder_core.autodiff.helpers import is_tensor, like, ops
from thunder_core.autodiff.registry import register_vjp
from thunder_core.autodiff.rules import _matmul_grads, basic_index_backward
from thunder_core.ops import prims as P


def _prim(symbol):
    def decorator(grads):
        @register_vjp(symbol)
        def rule(*args, **kwargs):
            out = symbol(*args, **kwargs)
            return out, lambda g: grads(out, g, *args, **kwargs)

        return grads

    return decorator


_UNARY = {
    P.neg: lambda out, g, a: ops.neg(g),
    P.exp: lambda out, g, a: ops.mul(g, out),
    P.exp2: lambda out, g, a: ops.mul(g, ops.mul(out, math.log(2))),
    P.expm1: lambda out, g, a: ops.mul(g, ops.add(out, 1)),
    P.log: lambda out, g, a: ops.div(g, a),
    P.log1p: lambda out, g, a: ops.div(g, ops.add(a, 1)),
    P.log2: lambda out, g, a: ops.div(g, ops.mul(a, math.log(2))),
    P.log10: lambda out, g, a: ops.div(g, ops.mul(a, math.log(10))),
    P.sin: lambda out, g, a: ops.mul(g, ops.cos(a)),
    P.cos: lambda out, g, a: ops.neg(ops.mul(g, ops.sin(a))),
    P.tanh: lambda out, g, a: K.tanh_backward(g, out),
    P.sigmoid: lambda out, g, a: K.sigmoid_backward(g, out),
    P.sqrt: lambda out, g, a: ops.div(g, ops.mul(out, 2)),
    P.rsqrt: lambda out, g, a: ops.mul(ops.mul(g, -0.5), ops.pow(out, 3)),
    P.reciprocal: lambda out, g, a: ops.neg(ops.mul(g, ops.mul(out, out))),
    P.erf: lambda out, g, a: ops.mul(g, ops.mul(ops.exp(ops.neg(ops.mul(a, a))), 2 / math.sqrt(math.pi))),
    P.abs: lambda out, g, a: ops.mul(g, ops.sign(a)),
    P.floor: lambda out, g, a: ops.mul(g, 0),
    P.ceil: lambda out, g, a: ops.mul(g, 0),
    P.round: lambda out, g, a: ops.mul(g, 0),
    P.trunc: lambda out, g, a: ops.mul(g, 0),
    P.sign: lambda out, g, a: ops.mul(g, 0),
    P.tan: lambda out, g, a: ops.mul(g, ops.add(ops.mul(out, out), 1)),
    P.sinh: lambda out, g, a: ops.mul(g, ops.cosh(a)),
    P.cosh: lambda out, g, a: ops.mul(g, ops.sinh(a)),
    P.asin: lambda out, g, a: ops.mul(g, ops.rsqrt(ops.rsub(ops.mul(a, a), 1))),
    P.acos: lambda out, g, a: ops.neg(ops.mul(g, ops.rsqrt(ops.rsub(ops.mul(a, a), 1)))),
    P.atan: lambda out, g, a: ops.div(g, ops.add(ops.mul(a, a), 1)),
    P.asinh: lambda out, g, a: ops.mul(g, ops.rsqrt(ops.add(ops.mul(a, a), 1))),
    P.acosh: lambda out, g, a: ops.mul(g, ops.rsqrt(ops.sub(ops.mul(a, a), 1))),
    P.atanh: lambda out, g, a: ops.div(g, ops.rsub(ops.mul(a, a), 1)),
    P.erfc: lambda out, g, a: ops.mul(g, ops.mul(ops.exp(ops.neg(ops.mul(a, a))), -2 / math.sqrt(math.pi))),
    P.erfinv: lambda out, g, a: ops.mul(g, ops.mul(ops.exp(ops.mul(out, out)), math.sqrt(math.pi) / 2)),
    P.lgamma: lambda out, g, a: ops.mul(g, ops.digamma(a)),
    P.digamma: lambda out, g, a: ops.mul(g, ops.polygamma(1, a)),
}
for _symbol, _grad in _UNARY.items():
    _prim(_symbol)(lambda out, g, a, _grad=_grad: [(a, like(_grad(out, g, a), a))])


@_prim(P.add)
def _(out, g, a, b):
    return [(a, like(g, a)), (b, like(g, b))]


@_prim(P.sub)
def _(out, g, a, b):
    return [(a, like(g, a)), (b, like(ops.neg(g), b))]


@_prim(P.mul)
def _(out, g, a, b):
    return [(a, like(ops.mul(g, b), a)), (b, like(ops.mul(g, a), b))]


@_prim(P.div)
def _(out, g, a, b):
    return [
        (a, like(ops.div(g, b), a)),
        (b, like(ops.neg(ops.div(ops.mul(g, out), b)), b) if is_tensor(b) else None),
    ]


@_prim(P.pow)
def _(out, g, a, b):
    pairs = [(a, like(ops.mul(ops.mul(g, b), ops.pow(a, ops.sub(b, 1) if is_tensor(b) else b - 1)), a))]
    if is_tensor(b):
        pairs.append((b, like(ops.mul(ops.mul(g, out), ops.log(a)), b)))
    return pairs


@_prim(P.maximum)
def _(out, g, a, b):
    from thunder_core.autodiff.rules import _extremum_grads

    return _extremum_grads(out, g, a, b, ops.gt)


@_prim(P.minimum)
def _(out, g, a, b):
    from thunder_core.autodiff.rules import _extremum_grads

    return _extremum_grads(out, g, a, b, ops.lt)


@_prim(P.atan2)
def _(out, g, a, b):
    scale = ops.div(g, ops.add(ops.mul(a, a), ops.mul(b, b)))
    return [(a, like(ops.mul(scale, b), a)), (b, like(ops.neg(ops.mul(scale, a)), b))]


@_prim(P.copysign)
def _(out, g, a, b):
    # |a| with b's sign: the derivative in a is out / a (0 at a == 0, as PyTorch's); none in b
    return [(a, like(ops.where(ops.eq(a, 0), 0.0, ops.mul(g, ops.div(out, a))), a))]


def _modulo(rounding_mode: str):
    """``a - div(a, b, rounding_mode) * b`` (fmod: trunc, remainder: floor): the derivative in a is
    1, in b minus the rounded quotient, as PyTorch's."""

    def grads(out, g, a, b):
        pairs = [(a, like(g, a))]
        if is_tensor(b):
            pairs.append((b, like(ops.neg(ops.mul(g, ops.div(a, b, rounding_mode=rounding_mode))), b)))
        return pairs

    return grads


_prim(P.fmod)(_modulo("trunc"))
_prim(P.remainder)(_modulo("floor"))


@_prim(P.where)
def _(out, g, condition, a, b):
    return [(a, like(ops.where(condition, g, 0.0), a)), (b, like(ops.where(condition, 0.0, g), b))]


@_prim(P.convert_element_type)
def _(out, g, a, dtype):
    return [(a, like(g, a))]


@_prim(P.device_put)
def _(out, g, a, device):
    return [(a, ops.to(g, a.device))]


@_prim(P.broadcast_in_dim)
def _(out, g, a, shape, broadcast_dims):
    summed = [d for d in range(len(shape)) if d not in broadcast_dims]
    summed += [d for i, d in enumerate(broadcast_dims) if a.shape[i] == 1 and shape[d] != 1]
    if summed:
        g = ops.sum(g, sorted(summed), True)
    return [(a, ops.reshape(g, tuple(a.shape)))]


@_prim(P.reshape)
def _(out, g, a, shape):
    return [(a, ops.reshape(g, tuple(a.shape)))]


@_prim(P.squeeze)
def _(out, g, a, dims):
    return [(a, ops.reshape(g, tuple(a.shape)))]


@_prim(P.permute)
def _(out, g, a, dims):
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return [(a, ops.permute(g, inverse))]


@_prim(P.slice)
def _(out, g, a, start_indices, end_indices, strides=None):
    strides = strides or [1] * len(start_indices)
    index = tuple(builtins.slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides))
    return [(a, basic_index_backward(g, tuple(a.shape), index))]


@_prim(P.flip)
def _(out, g, a, dims):
    return [(a, ops.flip(g, dims))]


@_prim(P.cat)
def _(out, g, tensors, dim):
    return list(zip(tensors, ops.split(g, [t.shape[dim] for t in tensors], dim)))


@_prim(P.sum)
def _(out, g, a, dims):
    shape = tuple(1 if d in dims else s for d, s in enumerate(a.shape))
    return [(a, ops.expand(ops.reshape(g, shape), tuple(a.shape)))]


def _extremum(out, g, a, dims):
    shape = tuple(1 if d in dims else s for d, s in enumerate(a.shape))
    hits = ops.to(ops.eq(a, ops.expand(ops.reshape(out, shape), tuple(a.shape))), g.dtype)
    count = ops.sum(hits, list(dims), True)
    return [(a, ops.div(ops.mul(ops.reshape(g, shape), hits), count))]


_prim(P.amax)(_extremum)
_prim(P.amin)(_extremum)


@_prim(P.var)
def _(out, g, a, dims, correction):
    shape = tuple(1 if d in dims else s for d, s in enumerate(a.shape))
    count = math.prod(a.shape[d] for d in dims)
    centered = ops.sub(a, ops.mean(a, list(dims), True))
    return [(a, ops.mul(ops.mul(ops.div(ops.reshape(g, shape), max(count - correction, 0)), centered), 2))]


@_prim(P.matmul)
def _(out, g, a, b):
    return _matmul_grads(g, a, b)


@_prim(P.take)
def _(out, g, a, index, dim):
    return [(a, ops.index_add(ops.zeros_like(a), dim, index, g))]


@_prim(P.gather)
def _(out, g, a, dim, index):
    return [(a, ops.scatter_add(ops.zeros_like(a), dim, index, g))]


@_prim(P.cumsum)
def _(out, g, a, dim):
    return [(a, ops.flip(ops.cumsum(ops.flip(g, (dim,)), dim), (dim,)))]
