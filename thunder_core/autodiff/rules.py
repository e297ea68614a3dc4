"""VJP rules for torch-level symbols.

Where eager autograd uses a fused ATen backward kernel (softmax, layer_norm, embedding,
attention, cross-entropy, gelu/silu, dropout), the rule uses the same kernel; the others
are a few torch-level ops. Symbols without a rule are differentiated through their
decomposition into prims, and ops without either through PyTorch autograd.
"""

from __future__ import annotations

import math

import torch

from thunder_core.autodiff import kernels as K
from thunder_core.autodiff.helpers import is_tensor, like, ops, product, sum_to, zeros_for
from thunder_core.autodiff.registry import AutogradOnly, NoRule, register_vjp
from thunder_core.ops._helpers import canonical_dim, canonical_dims
from thunder_core.ops.registry import TORCH_SYMBOLS as S

AUTOGRAD = "autograd"  # what a ``covers`` predicate returns for a call only PyTorch's autograd differentiates


def _simple(name, covers=None):
    """Register ``grads(out, g, *args, **kwargs) -> list of (input, grad)`` as S[name]'s rule.

    ``covers(*args, **kwargs)``: whether the rule covers this call form; one it does not cover
    goes through the decomposition or PyTorch's autograd (``AUTOGRAD``: PyTorch's autograd
    only). It is asked when the rule is applied: ``grads`` runs later, while the backward is
    built, too late to choose another way."""

    def decorator(grads):
        @register_vjp(S[name])
        def rule(*args, **kwargs):
            covered = True if covers is None else covers(*args, **kwargs)
            if covered is AUTOGRAD:
                raise AutogradOnly
            if not covered:
                raise NoRule
            out = S[name](*args, **kwargs)
            return out, lambda g: grads(out, g, *args, **kwargs)

        return grads

    return decorator


# Elementwise, unary.
@_simple("neg")
def _(out, g, a, **_):
    return [(a, ops.neg(g))]


@_simple("exp")
def _(out, g, a, **_):
    return [(a, like(ops.mul(g, out), a))]


@_simple("log")
def _(out, g, a, **_):
    return [(a, like(ops.div(g, a), a))]


@_simple("log1p")
def _(out, g, a, **_):
    return [(a, like(ops.div(g, ops.add(a, 1)), a))]


@_simple("expm1")
def _(out, g, a, **_):
    return [(a, like(ops.mul(g, ops.add(out, 1)), a))]


@_simple("sin")
def _(out, g, a, **_):
    return [(a, like(ops.mul(g, ops.cos(a)), a))]


@_simple("cos")
def _(out, g, a, **_):
    return [(a, like(ops.neg(ops.mul(g, ops.sin(a))), a))]


@_simple("tanh")
def _(out, g, a, **_):
    return [(a, K.tanh_backward(g, out))]


@_simple("sigmoid")
def _(out, g, a, **_):
    return [(a, K.sigmoid_backward(g, out))]


@_simple("sqrt")
def _(out, g, a, **_):
    return [(a, like(ops.div(g, ops.mul(out, 2)), a))]


@_simple("rsqrt")
def _(out, g, a, **_):
    return [(a, like(ops.mul(ops.mul(g, -0.5), ops.pow(out, 3)), a))]


@_simple("reciprocal")
def _(out, g, a, **_):
    return [(a, like(ops.neg(ops.mul(g, ops.mul(out, out))), a))]


@_simple("erf")
def _(out, g, a, **_):
    return [(a, like(ops.mul(g, ops.mul(ops.exp(ops.neg(ops.mul(a, a))), 2 / math.sqrt(math.pi))), a))]


@_simple("abs")
def _(out, g, a, **_):
    return [(a, like(ops.mul(g, ops.sign(a)), a))]


@_simple("relu")
def _(out, g, a, inplace=False):
    return [(a, K.threshold_backward(g, out, 0))]


@_simple("gelu")
def _(out, g, a, approximate="none"):
    return [(a, K.gelu_backward(g, a, approximate=approximate))]


@_simple("silu")
def _(out, g, a, inplace=False):
    return [(a, K.silu_backward(g, a))]


@_simple("square")
def _(out, g, a):
    return [(a, like(ops.mul(g, ops.mul(a, 2)), a))]


# Elementwise, binary.
@_simple("add")
def _(out, g, a, b, *, alpha=None):
    gb = g if alpha in (None, 1) else ops.mul(g, alpha)
    return [(a, like(g, a)), (b, like(gb, b))]


@_simple("sub")
def _(out, g, a, b, *, alpha=None):
    gb = ops.neg(g) if alpha in (None, 1) else ops.mul(g, -alpha)
    return [(a, like(g, a)), (b, like(gb, b))]


@_simple("rsub")
def _(out, g, a, b, *, alpha=None):
    ga = ops.neg(g) if alpha in (None, 1) else ops.mul(g, -alpha)
    return [(a, like(ga, a)), (b, like(g, b))]


@_simple("mul")
def _(out, g, a, b):
    return [
        (a, like(ops.mul(g, b), a) if is_tensor(a) else None),
        (b, like(ops.mul(g, a), b) if is_tensor(b) else None),
    ]


def _three_positional_tensors(*args, out=None, **kwargs):
    """addmm/baddbmm/addcmul called with their three tensors by position (``tensor1=`` and other
    keyword forms go through the decomposition) and scalars by keyword only."""
    scalars = {"value", "beta", "alpha"}
    return out is None and kwargs.keys() <= scalars and len(args) == 3 and all(is_tensor(x) for x in args)


def _add_product_grads(g, input, a, b, beta, alpha):
    """Gradients of ``beta * input + alpha * (a @ b)`` (addmm, baddbmm): a float16/bfloat16 one
    keeps the product whole, and is differentiated here rather than by PyTorch's autograd."""
    scaled = g if alpha == 1 else ops.mul(g, alpha)
    return [
        (input, like(g if beta == 1 else ops.mul(g, beta), input)),
        (a, like(product(scaled, ops.transpose(b, -2, -1)), a)),
        (b, like(product(ops.transpose(a, -2, -1), scaled), b)),
    ]


for _name in ("addmm", "baddbmm"):
    _simple(_name, covers=_three_positional_tensors)(
        lambda out, g, input, a, b, *, beta=1, alpha=1, **_: _add_product_grads(g, input, a, b, beta, alpha)
    )


@_simple("addcmul", covers=_three_positional_tensors)
def _(out, g, input, a, b, *, value=1, **_):
    # eager's formula, operation by operation (its float16/bfloat16 gradients round as these do)
    return [
        (input, like(g, input)),
        (a, like(ops.mul(g, ops.mul(b, value)), a)),
        (b, like(ops.mul(g, ops.mul(a, value)), b)),
    ]


@register_vjp(S["div"])
def _div(a, b, *, rounding_mode=None):
    if rounding_mode is not None:
        raise NoRule
    out = ops.div(a, b)

    def backward(g):
        ga = like(ops.div(g, b), a) if is_tensor(a) else None
        gb = like(ops.neg(ops.div(ops.mul(g, out), b)), b) if is_tensor(b) else None
        return [(a, ga), (b, gb)]

    return out, backward


@_simple("pow")
def _(out, g, a, b):
    pairs = []
    if is_tensor(a):
        if is_tensor(b):
            ga = ops.mul(ops.mul(g, b), ops.pow(a, ops.sub(b, 1)))
        elif b == 0:
            ga = ops.mul(g, 0)
        elif b == 2:
            ga = ops.mul(g, ops.mul(a, 2))
        else:
            ga = ops.mul(ops.mul(g, b), ops.pow(a, b - 1))
        pairs.append((a, like(ga, a)))
    if is_tensor(b):
        log_a = ops.log(a) if is_tensor(a) else math.log(a)
        pairs.append((b, like(ops.mul(ops.mul(g, out), log_a), b)))
    return pairs


def _extremum_grads(out, g, a, b, prefer_a):
    equal = ops.eq(a, b)
    half = ops.div(g, 2)
    chosen_a = prefer_a(a, b)
    ga = ops.where(equal, half, ops.where(chosen_a, g, 0.0))
    gb = ops.where(equal, half, ops.where(chosen_a, 0.0, g))
    return [(a, like(ga, a)), (b, like(gb, b))]


@_simple("maximum")
def _(out, g, a, b):
    return _extremum_grads(out, g, a, b, ops.gt)


@_simple("minimum")
def _(out, g, a, b):
    return _extremum_grads(out, g, a, b, ops.lt)


@register_vjp(S["where"])
def _where(condition, a=None, b=None):
    if a is None or b is None:
        raise NoRule
    out = ops.where(condition, a, b)

    def backward(g):
        pairs = []
        if is_tensor(a):
            pairs.append((a, like(ops.where(condition, g, 0.0), a)))
        if is_tensor(b):
            pairs.append((b, like(ops.where(condition, 0.0, g), b)))
        return pairs

    return out, backward


@_simple("masked_fill")
def _(out, g, a, mask, value):
    pairs = [(a, like(ops.masked_fill(g, mask, 0.0), a))]
    if is_tensor(value):
        pairs.append((value, like(ops.sum(ops.where(mask, g, 0.0)), value)))
    return pairs


@register_vjp(S["clamp"])
def _clamp(a, min=None, max=None):
    if is_tensor(min) or is_tensor(max) or (min is None and max is None):
        raise NoRule
    out = ops.clamp(a, min, max)

    def backward(g):
        keep = None
        if min is not None:
            keep = ops.ge(a, min)
        if max is not None:
            upper = ops.le(a, max)
            keep = upper if keep is None else ops.logical_and(keep, upper)
        return [(a, like(ops.where(keep, g, 0.0), a))]

    return out, backward


# Conversions.
def _cast_back(out, g, a, *args, **kwargs):
    return [(a, like(ops.to(g, a.dtype) if g.device == a.device else ops.to(g, a.device, a.dtype), a))]


for _name in ("to", "float", "double", "half", "bfloat16", "type_as", "cpu", "cuda"):
    _simple(_name)(_cast_back)


@_simple("contiguous")
def _(out, g, a, *args, **kwargs):
    return [(a, g)]


@_simple("clone")
def _(out, g, a, *args, **kwargs):
    return [(a, g)]


# Shapes.
def _back_to_shape(out, g, a, *args, **kwargs):
    return [(a, ops.reshape(g, tuple(a.shape)))]


for _name in ("reshape", "view", "view_as", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze"):
    _simple(_name)(_back_to_shape)


@_simple("permute")
def _(out, g, a, *dims):
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    dims = [canonical_dim(d, a.ndim) for d in dims]
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return [(a, ops.permute(g, inverse))]


@_simple("transpose")
def _(out, g, a, dim0, dim1):
    return [(a, ops.transpose(g, dim0, dim1))]


@_simple("t")
def _(out, g, a):
    return [(a, ops.t(g))]


@_simple("mT")
def _(out, g, a):
    return [(a, ops.transpose(g, -2, -1))]


def _unbroadcast(out, g, a, *args, **kwargs):
    return [(a, sum_to(g, tuple(a.shape)))]


for _name in ("expand", "expand_as", "broadcast_to"):
    _simple(_name)(_unbroadcast)


@_simple("cat")
def _(out, g, tensors, dim=0):
    live = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0 and out.ndim != 1)]
    d = canonical_dim(dim, out.ndim)
    pieces = ops.split(g, [t.shape[d] for t in live], d)
    return list(zip(live, pieces))


@_simple("stack")
def _(out, g, tensors, dim=0):
    d = canonical_dim(dim, out.ndim)
    return list(zip(tensors, ops.unbind(g, d)))


def _join_pieces(out, grads, a, dim, joiner):
    grads = [g if g is not None else zeros_for(o) for g, o in zip(grads, out)]
    return [(a, joiner(grads, dim))]


@_simple("split")
def _(out, g, a, split_size_or_sections, dim=0):
    return _join_pieces(out, g, a, canonical_dim(dim, a.ndim), ops.cat)


@_simple("split_with_sizes")
def _(out, g, a, split_sizes, dim=0):
    return _join_pieces(out, g, a, canonical_dim(dim, a.ndim), ops.cat)


@_simple("chunk")
def _(out, g, a, chunks, dim=0):
    return _join_pieces(out, g, a, canonical_dim(dim, a.ndim), ops.cat)


@_simple("unbind")
def _(out, g, a, dim=0):
    return _join_pieces(out, g, a, canonical_dim(dim, a.ndim), ops.stack)


@_simple("narrow", covers=lambda a, dim, start, length: not is_tensor(start))
def _(out, g, a, dim, start, length):
    d = canonical_dim(dim, a.ndim)
    start = start % a.shape[d] if start < 0 else start
    return [(a, K.slice_backward(g, tuple(a.shape), d, start, start + length, 1))]


def _is_basic_index(index) -> bool:
    items = index if type(index) is tuple else (index,)
    return all(item is None or item is Ellipsis or isinstance(item, (int, slice)) for item in items)


@register_vjp(S["getitem"])
def _getitem(a, index):
    if not _is_basic_index(index):
        raise NoRule
    out = ops.getitem(a, index)

    def backward(g):
        return [(a, basic_index_backward(g, tuple(a.shape), index))]

    return out, backward


def _basic_index_backward(g, shape, index):
    grad = g.new_zeros(shape)
    grad[index] = g
    return grad


from thunder_core.ir.symbols import Symbol  # noqa: E402

basic_index_backward = Symbol(
    name="basic_index_backward", impl=_basic_index_backward, printed_name="basic_index_backward"
)


@_simple("flip")
def _(out, g, a, *dims, **kwargs):
    dims = dims if dims else (kwargs["dims"],)
    return [(a, ops.flip(g, *dims))]


@_simple("tril")
def _(out, g, a, diagonal=0):
    return [(a, ops.tril(g, diagonal))]


@_simple("triu")
def _(out, g, a, diagonal=0):
    return [(a, ops.triu(g, diagonal))]


@_simple("repeat_interleave", covers=lambda a, repeats, dim=None, *, output_size=None: not is_tensor(repeats))
def _(out, g, a, repeats, dim=None, *, output_size=None):
    if dim is None:
        return [(a, ops.reshape(ops.sum(ops.reshape(g, (-1, repeats)), 1), tuple(a.shape)))]
    d = canonical_dim(dim, a.ndim)
    split = (*a.shape[:d], a.shape[d], repeats, *a.shape[d + 1 :])
    return [(a, ops.sum(ops.reshape(g, split), d + 1))]


# Reductions.
def _restore_dims(g, a, dims, keepdim):
    if not keepdim:
        shape = tuple(1 if d in dims else s for d, s in enumerate(a.shape))
        g = ops.reshape(g, shape)
    return ops.expand(g, tuple(a.shape))


@_simple("sum")
def _(out, g, a, dim=None, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, a.ndim)
    return [(a, like(_restore_dims(g, a, dims, keepdim), a))]


@_simple("mean")
def _(out, g, a, dim=None, keepdim=False, *, dtype=None):
    dims = canonical_dims(dim, a.ndim)
    count = math.prod(a.shape[d] for d in dims)
    return [(a, like(ops.div(_restore_dims(g, a, dims, keepdim), count), a))]


@register_vjp(S["var"])
def _var(a, *args, **kwargs):
    from thunder_core.ops.reductions import _var_args

    dim, correction, keepdim = _var_args(args, dict(kwargs))
    out = ops.var(a, *args, **kwargs)

    def backward(g):
        dims = canonical_dims(dim, a.ndim)
        count = math.prod(a.shape[d] for d in dims)
        centered = ops.sub(a, ops.mean(a, dims, True))
        scale = ops.div(_restore_dims(g, a, dims, keepdim), max(count - correction, 0))
        return [(a, like(ops.mul(ops.mul(scale, centered), 2), a))]

    return out, backward


def _extremum_rule(name):
    @register_vjp(S[name])
    def rule(a, dim=None, keepdim=False):
        if is_tensor(dim):
            raise NoRule
        out = S[name](a, dim, keepdim) if dim is not None else S[name](a)
        if isinstance(out, tuple):
            raise NoRule  # (values, indices): through the decomposition or autograd

        def backward(g):
            dims = canonical_dims(dim, a.ndim)
            expanded = _restore_dims(out, a, dims, keepdim)
            hits = ops.to(ops.eq(a, expanded), g.dtype)
            count = _restore_dims(ops.sum(hits, dims, True), a, dims, True)
            return [(a, like(ops.div(ops.mul(_restore_dims(g, a, dims, keepdim), hits), count), a))]

        return out, backward


for _name in ("amax", "amin", "max", "min"):
    _extremum_rule(_name)


@_simple("logsumexp")
def _(out, g, a, dim, keepdim=False):
    dims = canonical_dims(dim, a.ndim)
    return [
        (
            a,
            like(
                ops.mul(
                    _restore_dims(g, a, dims, keepdim),
                    ops.exp(ops.sub(a, _restore_dims(out, a, dims, keepdim))),
                ),
                a,
            ),
        )
    ]


@_simple("cumsum")
def _(out, g, a, dim, *, dtype=None):
    d = canonical_dim(dim, a.ndim)
    return [(a, like(ops.flip(ops.cumsum(ops.flip(g, (d,)), d), (d,)), a))]


@_simple("softmax", covers=lambda a, dim=None, _stacklevel=3, dtype=None: dim is not None)
def _(out, g, a, dim=None, _stacklevel=3, dtype=None):
    # The kernel in the output's dtype, then cast: with dtype= (an upcast), ATen's CPU kernel returns the
    # gradient's dtype whatever input_dtype says, while its meta says input_dtype.
    return [(a, like(K.softmax_backward(g, out, canonical_dim(dim, a.ndim), out.dtype), a))]


@_simple("log_softmax", covers=lambda a, dim=None, _stacklevel=3, dtype=None: dim is not None)
def _(out, g, a, dim=None, _stacklevel=3, dtype=None):
    # The kernel in the output's dtype, then cast: with dtype= (an upcast), ATen's CPU kernel returns the
    # gradient's dtype whatever input_dtype says, while its meta says input_dtype.
    return [(a, like(K.log_softmax_backward(g, out, canonical_dim(dim, a.ndim), out.dtype), a))]


# Linear algebra.
def _matmul_grads(g, a, b):
    """Gradients of ``a @ b`` for every torch.matmul case, 1-D operands included."""
    a2 = ops.unsqueeze(a, 0) if a.ndim == 1 else a
    b2 = ops.unsqueeze(b, -1) if b.ndim == 1 else b
    batch = tuple(torch.broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2])))
    g2 = ops.reshape(g, (*batch, a2.shape[-2], b2.shape[-1])) if (a.ndim == 1 or b.ndim == 1) else g
    ga = product(g2, ops.transpose(b2, -2, -1))
    gb = product(ops.transpose(a2, -2, -1), g2)
    ga = sum_to(ga, tuple(a2.shape))
    gb = sum_to(gb, tuple(b2.shape))
    return [(a, like(ops.reshape(ga, tuple(a.shape)), a)), (b, like(ops.reshape(gb, tuple(b.shape)), b))]


for _name in ("matmul", "mm", "bmm"):
    _simple(_name)(lambda out, g, a, b, **_: _matmul_grads(g, a, b))


@_simple("linear")
def _(out, g, x, weight, bias=None):
    pairs = [(x, ops.matmul(g, weight))]
    g2 = ops.reshape(g, (-1, g.shape[-1]))
    x2 = ops.reshape(x, (-1, x.shape[-1]))
    pairs.append((weight, product(ops.t(g2), x2)))
    if bias is not None:
        pairs.append((bias, ops.sum(g2, 0)))
    return pairs


# Neural-network ops with fused backward kernels.
def _dense_embedding(
    indices, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False
):
    return AUTOGRAD if sparse else True  # a sparse gradient: PyTorch's autograd makes it


@_simple("embedding", covers=_dense_embedding)
def _(
    out,
    g,
    indices,
    weight,
    padding_idx=None,
    max_norm=None,
    norm_type=2.0,
    scale_grad_by_freq=False,
    sparse=False,
):
    # max_norm renormalizes the looked-up rows of ``weight`` in place, without autograd, before the
    # lookup: the gradient is the lookup's, as in eager.
    padding = -1 if padding_idx is None else padding_idx
    return [(weight, K.embedding_dense_backward(g, indices, weight.shape[0], padding, scale_grad_by_freq))]


@register_vjp(S["layer_norm"])
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    out, mean, rstd = K.native_layer_norm(x, list(normalized_shape), weight, bias, eps)

    def backward(g):
        mask = [True, weight is not None, bias is not None]
        gx, gw, gb = K.native_layer_norm_backward(
            g, x, list(normalized_shape), mean, rstd, weight, bias, mask
        )
        return [(x, gx), (weight, gw), (bias, gb)]

    return out, backward


if "rms_norm" in S:

    @_simple("rms_norm")
    def _(out, g, x, normalized_shape, weight=None, eps=None):
        dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
        eps = torch.finfo(x.dtype).eps if eps is None else eps
        xf = ops.to(x, torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
        gf = ops.to(g, xf.dtype)
        rstd = ops.rsqrt(ops.add(ops.mean(ops.mul(xf, xf), dims, True), eps))
        gw_input = ops.mul(gf, weight) if weight is not None else gf
        dot = ops.mean(ops.mul(gw_input, xf), dims, True)
        gx = ops.mul(rstd, ops.sub(gw_input, ops.mul(ops.mul(xf, ops.mul(rstd, rstd)), dot)))
        pairs = [(x, like(gx, x))]
        if weight is not None:
            normalized = ops.mul(xf, rstd)
            pairs.append((weight, like(ops.mul(gf, normalized), weight)))
        return pairs


@register_vjp(S["scaled_dot_product_attention"])
def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p != 0.0 or enable_gqa or q.ndim != 4 or k.shape[-3] != q.shape[-3]:
        raise NoRule
    if attn_mask is not None and attn_mask.requires_grad:
        raise NoRule  # a learned bias: the fused kernels give it no gradient
    devices = {q.device.type, k.device.type, v.device.type}
    if devices == {"cuda"}:
        return _sdpa_cuda(q, k, v, attn_mask, is_causal, scale)
    if devices != {"cpu"}:
        raise NoRule
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # As eager SDPA does on CPU: a boolean mask becomes an additive one (0 where kept, -inf
        # where masked), which the flash kernel takes; no materialized attention matrix.
        if attn_mask.dtype == q.dtype or not q.dtype.is_floating_point:
            raise NoRule
        zeros = S["zeros"](tuple(attn_mask.shape), dtype=q.dtype, device=q.device)
        attn_mask = S["masked_fill"](zeros, S["logical_not"](attn_mask), float("-inf"))
    out, logsumexp = K.flash_attention_cpu(q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)

    def backward(g):
        gq, gk, gv = K.flash_attention_cpu_backward(
            g, q, k, v, out, logsumexp, 0.0, is_causal, attn_mask=attn_mask, scale=scale
        )
        return [(q, gq), (k, gk), (v, gv)]

    return out, backward


def _sdpa_cuda(q, k, v, attn_mask, is_causal, scale):
    """CUDA: PyTorch's memory-efficient attention kernels, forward and backward (no O(S^2) matrix)."""
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            zeros = S["zeros"](tuple(attn_mask.shape), dtype=q.dtype, device=q.device)
            attn_mask = S["masked_fill"](zeros, S["logical_not"](attn_mask), float("-inf"))
        elif attn_mask.dtype != q.dtype:
            raise NoRule
        bias = K.attention_bias(attn_mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    out, logsumexp, seed, offset = K.efficient_attention(q, k, v, bias, True, 0.0, is_causal, scale=scale)

    def backward(g):
        gq, gk, gv, _ = K.efficient_attention_backward(
            g,
            q,
            k,
            v,
            bias,
            out,
            logsumexp,
            seed,
            offset,
            0.0,
            [True, True, True, False],
            is_causal,
            scale=scale,
        )
        return [(q, gq), (k, gk), (v, gv)]

    return out, backward


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


@register_vjp(S["cross_entropy"])
def _cross_entropy(
    logits,
    target,
    weight=None,
    size_average=None,
    ignore_index=-100,
    reduce=None,
    reduction="mean",
    label_smoothing=0.0,
):
    if (
        size_average is not None
        or reduce is not None
        or label_smoothing != 0.0
        or target.dtype.is_floating_point
    ):
        raise NoRule
    if logits.ndim != 2:
        raise NoRule
    code = _REDUCTIONS[reduction]
    logp = K.log_softmax(logits, 1, False)
    loss, total_weight = K.nll_loss_forward(logp, target, weight, code, ignore_index)

    def backward(g):
        g_logp = K.nll_loss_backward(g, logp, target, weight, code, ignore_index, total_weight)
        return [(logits, K.log_softmax_backward(g_logp, logp, 1, logits.dtype))]

    return loss, backward


@register_vjp(S["dropout"])
def _dropout(a, p=0.5, training=True, inplace=False):
    if inplace:
        raise NoRule
    if not training or p == 0:
        out = S["dropout"](a, p, training)
        return out, lambda g: [(a, g)]
    out, mask = K.native_dropout(a, p, True)
    return out, lambda g: [(a, K.native_dropout_backward(g, mask, 1.0 / (1.0 - p)))]


# Indexing.
@_simple("gather")
def _(out, g, a, dim, index, *, sparse_grad=False):
    d = canonical_dim(dim, a.ndim)
    return [(a, ops.scatter_add(ops.zeros_like(a), d, index, g))]


@_simple("index_select")
def _(out, g, a, dim, index):
    d = canonical_dim(dim, a.ndim)
    return [(a, ops.index_add(ops.zeros_like(a), d, index, g))]


@_simple("scatter_add")
def _(out, g, a, dim, index, src):
    d = canonical_dim(dim, a.ndim)
    return [(a, g), (src, ops.gather(g, d, index))]


@_simple("topk")
def _(out, g, a, k, dim=-1, largest=True, sorted=True):
    values_grad = g[0] if isinstance(g, list) else g
    if values_grad is None:
        return []
    d = canonical_dim(dim, a.ndim)
    return [(a, ops.scatter(ops.zeros_like(a), d, out[1], values_grad))]
