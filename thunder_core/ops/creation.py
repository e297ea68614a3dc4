"""Tensor factories: arange, zeros/ones/full/empty and their *_like and new_* forms, random."""

from __future__ import annotations

import math

import torch

from thunder_core.ir.symbols import RANDOM
from thunder_core.ops import prims
from thunder_core.ops._helpers import NoDecomposition, is_tensor
from thunder_core.ops.registry import register_torch_op
from thunder_core.ops.shapes import _sizes

T = torch.Tensor


def _plain_options(
    layout=None, requires_grad=False, pin_memory=False, memory_format=None, out=None, names=None
):
    if requires_grad or pin_memory or out is not None or names is not None:
        raise NoDecomposition
    if layout not in (None, torch.strided):
        raise NoDecomposition


def _device(device):
    return torch.device(device) if device is not None else torch.get_default_device()


def _arange(start, end=None, step=1, *, dtype=None, device=None, **options):
    _plain_options(**options)
    if end is None:
        start, end = 0, start
    if any(is_tensor(x) for x in (start, end, step)):
        raise NoDecomposition
    if dtype is None:
        integral = all(isinstance(x, int) for x in (start, end, step))
        dtype = torch.int64 if integral else torch.get_default_dtype()
    length = max(math.ceil((end - start) / step), 0)
    return prims.iota(length, start, step, dtype, _device(device))


register_torch_op("arange", torch.arange, decomposition=_arange)


def _fill_dtype(value, dtype):
    if dtype is not None:
        return dtype
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, complex):
        return torch.complex64
    return torch.get_default_dtype()


def _constant_factory(value):
    def decomposition(*size, dtype=None, device=None, **options):
        _plain_options(**options)
        return prims.full(_sizes(size), value, dtype or torch.get_default_dtype(), _device(device))

    return decomposition


register_torch_op("zeros", torch.zeros, decomposition=_constant_factory(0))
register_torch_op("ones", torch.ones, decomposition=_constant_factory(1))


def _full(size, fill_value, *, dtype=None, device=None, **options):
    _plain_options(**options)
    if is_tensor(fill_value):
        raise NoDecomposition
    return prims.full(tuple(size), fill_value, _fill_dtype(fill_value, dtype), _device(device))


register_torch_op("full", torch.full, decomposition=_full)


def _like(value):
    def decomposition(a, *, dtype=None, device=None, **options):
        _plain_options(**options)
        return prims.full(tuple(a.shape), value, dtype or a.dtype, _device(device) if device else a.device)

    return decomposition


register_torch_op("zeros_like", torch.zeros_like, decomposition=_like(0))
register_torch_op("ones_like", torch.ones_like, decomposition=_like(1))


def _full_like(a, fill_value, *, dtype=None, device=None, **options):
    _plain_options(**options)
    return prims.full(tuple(a.shape), fill_value, dtype or a.dtype, _device(device) if device else a.device)


register_torch_op("full_like", torch.full_like, decomposition=_full_like)


def _new(value):
    def decomposition(a, *size, dtype=None, device=None, **options):
        _plain_options(**options)
        return prims.full(_sizes(size), value, dtype or a.dtype, _device(device) if device else a.device)

    return decomposition


register_torch_op("new_zeros", T.new_zeros, decomposition=_new(0))
register_torch_op("new_ones", T.new_ones, decomposition=_new(1))


def _new_full(a, size, fill_value, *, dtype=None, device=None, **options):
    _plain_options(**options)
    return prims.full(tuple(size), fill_value, dtype or a.dtype, _device(device) if device else a.device)


register_torch_op("new_full", T.new_full, decomposition=_new_full)

# Uninitialized memory and random draws stay leaves: their values are not a function of inputs.
for _name in ("empty", "empty_like"):
    register_torch_op(_name, getattr(torch, _name))
register_torch_op("new_empty", T.new_empty)
for _name in ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "bernoulli"):
    register_torch_op(_name, getattr(torch, _name), tags=(RANDOM,))
