"""The quantized weights and matmuls as thunder_core symbols.

While a quantized module is captured, each quantized weight is seen by the forward as
``quant_dequantize_int8(q, scale)`` (or the int4 one): a float tensor of the original shape, so
any code that reads the weight stays correct. The ``rewrite`` pass then turns each
``linear(x, dequantized, bias)`` into ``quant_int8_linear`` / ``quant_int4_linear``, which run
PyTorch's low-bit CPU kernels on the packed weight; a dequantization nothing else reads is
removed with the rest of the dead code.
"""

from __future__ import annotations

from thunder_core.extend import Symbol, get_symbol, new_tensor_proxy
from thunder_plugin_quantization import kernels

_matmul = get_symbol("matmul")
_sum = get_symbol("sum")


def _dequantize_int8_meta(q, scale):
    return new_tensor_proxy(tuple(q.shape), scale.dtype, q.device)


def _dequantize_int4_meta(packed, scales_and_zeros, group_size: int, weight_shape: tuple):
    return new_tensor_proxy(tuple(weight_shape), scales_and_zeros.dtype, packed.device)


dequantize_int8 = Symbol(
    "quant_dequantize_int8", kernels.dequantize_int8, "quant_dequantize_int8", meta=_dequantize_int8_meta
)
dequantize_int4 = Symbol(
    "quant_dequantize_int4", kernels.dequantize_int4, "quant_dequantize_int4", meta=_dequantize_int4_meta
)


def _int8_linear(x, q, scale, bias=None):
    out = kernels.int8_matmul(x, q, scale)
    return out if bias is None else out + bias


def _int4_linear(x, packed, scales_and_zeros, group_size: int, weight_shape: tuple, bias=None):
    out = kernels.int4_matmul(x, packed, scales_and_zeros, group_size, weight_shape[0])
    return out if bias is None else out + bias


def _linear_meta(x, weight_rows: int, bias):
    return new_tensor_proxy(
        (*x.shape[:-1], weight_rows),
        x.dtype,
        x.device,
        x.requires_grad or (bias is not None and bias.requires_grad),
    )


def _grads(out, g, x, weight, bias):
    """Gradients of ``x @ weight.T + bias`` for ``x`` and ``bias``; the quantized weight has none."""
    grads = [(x, _matmul(g, weight))]
    if bias is not None:
        grads.append((bias, _sum(g, tuple(range(g.dim() - 1)))))
    return grads


def _int8_vjp(x, q, scale, bias=None):
    out = int8_linear(x, q, scale, bias)
    return out, lambda g: _grads(out, g, x, dequantize_int8(q, scale), bias)


def _int4_vjp(x, packed, scales_and_zeros, group_size: int, weight_shape: tuple, bias=None):
    out = int4_linear(x, packed, scales_and_zeros, group_size, weight_shape, bias)
    weight = lambda: dequantize_int4(packed, scales_and_zeros, group_size, weight_shape)  # noqa: E731
    return out, lambda g: _grads(out, g, x, weight(), bias)


int8_linear = Symbol(
    "quant_int8_linear",
    _int8_linear,
    "quant_int8_linear",
    meta=lambda x, q, scale, bias=None: _linear_meta(x, q.shape[0], bias),
    vjp=_int8_vjp,
)
int4_linear = Symbol(
    "quant_int4_linear",
    _int4_linear,
    "quant_int4_linear",
    meta=lambda x, packed, sz, group_size, weight_shape, bias=None: _linear_meta(x, weight_shape[0], bias),
    vjp=_int4_vjp,
)
