"""From a region's prims to the CUDA C body of one CuPy ElementwiseKernel (pure logic).

Regions here are same-shape elementwise computations (scalar constants allowed): every
tensor of the region has the output's shape and is read at the same flat index ``i``.
Half-precision inputs are computed in float (the decompositions already upcast).
"""

from __future__ import annotations

import math
import re

import torch

from thunder_core.extend import RegionNotSupported, TensorProxy, flatten_to_prims

# The torch-level ops the executor claims whole (their decompositions into SUPPORTED prims fuse).
ELEMENTWISE_OPS = ("add", "sub", "mul", "div", "neg", "exp", "log", "tanh", "sigmoid", "erf", "sqrt", "rsqrt",
                   "gelu", "silu", "relu", "where", "pow", "maximum", "minimum")  # fmt: skip
C_TYPES = {torch.float32: "float32", torch.float16: "float16", torch.float64: "float64", torch.bool: "bool"}
C_NAMES = {torch.float32: "float", torch.float16: "float16", torch.float64: "double", torch.bool: "bool"}

UNARY = {
    "neg": "(-{a})",
    "abs": "fabs({a})",
    "exp": "exp({a})",
    "log": "log({a})",
    "log1p": "log1p({a})",
    "expm1": "expm1({a})",
    "sin": "sin({a})",
    "cos": "cos({a})",
    "tanh": "tanh({a})",
    "erf": "erf({a})",
    "sqrt": "sqrt({a})",
    "rsqrt": "rsqrt({a})",
    "reciprocal": "(1 / {a})",
    "floor": "floor({a})",
    "ceil": "ceil({a})",
    "trunc": "trunc({a})",
    "sigmoid": "(1 / (1 + exp(-{a})))",
    "logical_not": "(!{a})",
}
BINARY = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "pow": "pow({a}, {b})", "maximum": "max({a}, {b})", "minimum": "min({a}, {b})", "eq": "({a} == {b})",
    "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})", "gt": "({a} > {b})", "ge": "({a} >= {b})",
    "bitwise_and": "({a} && {b})", "bitwise_or": "({a} || {b})",
}  # fmt: skip
SUPPORTED = (
    set(UNARY) | set(BINARY) | {"where", "convert_element_type", "reshape", "squeeze", "broadcast_in_dim"}
)


class Unsupported(RegionNotSupported):
    pass


_prims = flatten_to_prims


# Non-finite float constants as bit patterns: NVRTC (which CuPy compiles with) includes no math
# headers, so INFINITY / CUDART_INF_F / CUDART_NAN_F are undefined there.
POSITIVE_INFINITY = "__int_as_float(0x7f800000)"
NOT_A_NUMBER = "__int_as_float(0x7fffffff)"


def _literal(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float) and not math.isfinite(x):
        return NOT_A_NUMBER if math.isnan(x) else (POSITIVE_INFINITY if x > 0 else f"(-{POSITIVE_INFINITY})")
    return repr(float(x)) + "f" if isinstance(x, float) else repr(x)


def broadcast_views(bsyms, inputs, outputs) -> list[tuple | None]:
    """For each region input, the shape to view it as before the kernel, or None to pass it as is.

    An input of another shape than the region's is allowed when the region only broadcasts it
    (``prims.broadcast_in_dim`` to the region's shape): viewed with ones in the broadcast
    dimensions, CuPy's ElementwiseKernel broadcasts it the way NumPy does (a bias of shape
    ``(n,)`` added to ``(m, n)`` rows, a ``(m,)`` scale of each row read as ``(m, 1)``).
    """
    prims = list(_prims(bsyms))
    shape = tuple(outputs[0].shape)
    views: list[tuple | None] = []
    for p in inputs:
        if tuple(p.shape) == shape or p.numel() == 1:
            views.append(None)
            continue
        uses = [
            b for b in prims if any(isinstance(a, TensorProxy) and a.name == p.name for a in b.flat_args())
        ]
        if not uses or any(b.symbol.name != "broadcast_in_dim" or tuple(b.args[1]) != shape for b in uses):
            raise Unsupported(f"{p.name} has shape {tuple(p.shape)}, not the region's {shape}")
        dims = {tuple(b.args[2]) for b in uses}
        if len(dims) != 1:
            raise Unsupported(f"{p.name} is broadcast in more than one way")
        view = [1] * len(shape)
        for size, dim in zip(p.shape, next(iter(dims))):
            view[dim] = size
        views.append(tuple(view))
    for p in outputs:
        if tuple(p.shape) != shape:
            raise Unsupported(f"{p.name} has shape {tuple(p.shape)}, not the region's {shape}")
    return views


def elementwise_kernel_spec(bsyms, inputs, outputs) -> tuple[str, str, str]:
    """(in_params, out_params, operation) for ``cupy.ElementwiseKernel``; inputs of other shapes
    are read broadcast (see ``broadcast_views``)."""
    prims = list(_prims(bsyms))
    shape = tuple(outputs[0].shape)
    broadcast_views(bsyms, inputs, outputs)
    for p in [*inputs, *outputs]:
        if p.dtype not in C_TYPES:
            raise Unsupported(f"dtype {p.dtype}")
    names = {p.name: f"in{k}" for k, p in enumerate(inputs)}
    lines = []
    for b in prims:
        op = b.symbol.name
        if op not in SUPPORTED:
            raise Unsupported(f"prims.{op}")
        (out,) = b.flat_outputs()
        if tuple(out.shape) != shape:
            raise Unsupported(f"prims.{op} makes shape {tuple(out.shape)}")
        args = [
            names[a.name] if isinstance(a, TensorProxy) else _literal(a)
            for a in b.args
            if not isinstance(a, (tuple, list, torch.dtype))
        ]
        if op in ("reshape", "squeeze", "broadcast_in_dim"):
            text = args[0]
        elif op == "convert_element_type":
            text = f"(({C_NAMES[out.dtype]}){args[0]})"
        elif op == "where":
            text = f"({args[0]} ? {args[1]} : {args[2]})"
        elif op in BINARY:
            text = BINARY[op].format(a=args[0], b=args[1])
        else:
            text = UNARY[op].format(a=args[0])
        var = f"v_{out.name}"
        lines.append(f"{C_NAMES[out.dtype]} {var} = {text};")
        names[out.name] = var
    for k, p in enumerate(outputs):
        lines.append(f"out{k} = {names[p.name]};")
    in_params = ", ".join(f"raw {C_TYPES[p.dtype]} in{k}" if p.numel() == 1 else f"{C_TYPES[p.dtype]} in{k}"
                          for k, p in enumerate(inputs))  # fmt: skip
    # scalar tensors are read as in{k}[0]
    body = "\n".join(lines)
    for k, p in enumerate(inputs):
        if p.numel() == 1:  # whole identifiers only: in1 must not rewrite in10
            body = re.sub(rf"\bin{k}\b", f"in{k}[0]", body)
    out_params = ", ".join(f"{C_TYPES[p.dtype]} out{k}" for k, p in enumerate(outputs))
    return in_params, out_params, body


SOFTMAX_SOURCE = r"""
extern "C" __global__ void thunder_softmax(const float* x, float* y, long long rows, long long cols) {
    long long row = blockIdx.x;
    if (row >= rows) return;
    const float* in = x + row * cols;
    float* out = y + row * cols;
    __shared__ float shared[32];
    float peak = -__int_as_float(0x7f800000);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) peak = fmaxf(peak, in[c]);
    for (int o = 16; o > 0; o /= 2) peak = fmaxf(peak, __shfl_xor_sync(0xffffffff, peak, o));
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = peak;
    __syncthreads();
    peak = -__int_as_float(0x7f800000);
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) peak = fmaxf(peak, shared[w]);
    __syncthreads();
    float total = 0.f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) total += expf(in[c] - peak);
    for (int o = 16; o > 0; o /= 2) total += __shfl_xor_sync(0xffffffff, total, o);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = total;
    __syncthreads();
    total = 0.f;
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += shared[w];
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(in[c] - peak) / total;
}
"""


def softmax_checker(x, dim=None, _stacklevel=3, dtype=None):
    """The RawKernel softmax takes float32 CUDA tensors over their last dim."""
    from thunder_core import Rejection

    if x.device.type != "cuda" or x.dtype != torch.float32 or dtype not in (None, torch.float32):
        return Rejection("cupy softmax takes float32 CUDA tensors")
    if dim is None or dim % x.ndim != x.ndim - 1:
        return Rejection("cupy softmax runs over the last dim")
    return True
