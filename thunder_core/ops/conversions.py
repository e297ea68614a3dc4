"""Dtype and device conversions: Tensor.to, .float() and friends, .cpu()/.cuda(), type_as."""

from __future__ import annotations

import torch
from torch._prims_common import _is_non_overlapping_and_dense_or_false

from thunder_core.ir.symbolic import SymbolicSizeError, has_symbolic_shape
from thunder_core.ops import prims
from thunder_core.ops._helpers import NoDecomposition, new_proxy
from thunder_core.ops.registry import register_torch_op

T = torch.Tensor


def _parse_to(a, args, kwargs) -> tuple[torch.dtype, torch.device]:
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    for x in args:
        if isinstance(x, torch.dtype):
            dtype = x
        elif isinstance(x, torch.Tensor):
            dtype, device = x.dtype, x.device
        elif isinstance(x, (str, torch.device)) or (isinstance(x, int) and not isinstance(x, bool)):
            device = x
    device = torch.device(device) if device is not None else a.device
    if device.type == "cuda" and device.index is None and a.device.type == "cuda":
        device = a.device
    return dtype or a.dtype, device


def _converted_proxy(a, dtype, device):
    requires_grad = (
        a.requires_grad and torch.is_grad_enabled() and (dtype.is_floating_point or dtype.is_complex)
    )
    strides = a.stride() if (dtype == a.dtype and device == a.device) else None
    if strides is None and has_symbolic_shape(a):
        # No meta tensor takes symbolic sizes: a dense layout is kept (preserve_format), others raise.
        if not _is_non_overlapping_and_dense_or_false(a.shape, a.stride()):
            raise SymbolicSizeError(
                f"converting a tensor of symbolic sizes {tuple(a.shape)} and overlapping strides"
            )
        strides = a.stride()
    if strides is None:
        strides = torch.empty_strided(a.shape, a.stride(), device="meta").to(dtype).stride()
    return new_proxy(a.shape, dtype, device, requires_grad, strides)


def _to_meta(a, *args, **kwargs):
    dtype, device = _parse_to(a, args, kwargs)
    return _converted_proxy(a, dtype, device)


def _to(a, *args, **kwargs):
    dtype, device = _parse_to(a, args, kwargs)
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        raise NoDecomposition
    if dtype == a.dtype and device == a.device:
        raise NoDecomposition
    out = prims.convert_element_type(a, dtype) if dtype != a.dtype else a
    return prims.device_put(out, device) if device != a.device else out


register_torch_op("to", T.to, decomposition=_to, meta=_to_meta)


def _device_method(device_type):
    def meta(a, *args, **kwargs):
        index = args[0] if args else kwargs.get("device")
        if device_type == "cpu":
            device = torch.device("cpu")
        elif index is None:
            device = a.device if a.device.type == "cuda" else torch.device("cuda", 0)
        else:
            device = torch.device("cuda", index) if isinstance(index, int) else torch.device(index)
        return _converted_proxy(a, a.dtype, device)

    return meta


register_torch_op("cpu", T.cpu, meta=_device_method("cpu"))
register_torch_op("cuda", T.cuda, meta=_device_method("cuda"))

_DTYPE_METHODS = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "long": torch.int64,
    "int": torch.int32,
    "short": torch.int16,
    "char": torch.int8,
    "byte": torch.uint8,
    "bool": torch.bool,
}


def _dtype_method(dtype):
    def decomposition(a, memory_format=torch.preserve_format):
        if a.dtype == dtype or memory_format != torch.preserve_format:
            raise NoDecomposition
        return prims.convert_element_type(a, dtype)

    return decomposition


for _name, _dtype in _DTYPE_METHODS.items():
    register_torch_op(_name, getattr(T, _name), decomposition=_dtype_method(_dtype))


def _type_as(a, other):
    if a.dtype == other.dtype:
        raise NoDecomposition
    return prims.convert_element_type(a, other.dtype)


register_torch_op("type_as", T.type_as, decomposition=_type_as)
register_torch_op("clone", torch.clone, T.clone)
register_torch_op("detach", torch.detach, T.detach)
