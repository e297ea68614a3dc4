"""The TorchFunctionMode that intercepts every torch call made while capturing."""

from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from thunder_core.errors import CaptureError, DataDependentError
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.source import calling_location, user_location
from thunder_core.ir.tree import tree_map
from thunder_core.ops.registry import lookup, opaque_symbol

T = torch.Tensor

# Metadata queries answered directly by the proxy (it has real metadata).
_METADATA = {
    T.shape.__get__, T.dtype.__get__, T.device.__get__, T.ndim.__get__, T.requires_grad.__get__,
    T.is_cuda.__get__, T.is_meta.__get__, T.layout.__get__, T.is_sparse.__get__, T.is_quantized.__get__,
    T.size, T.dim, T.ndimension, T.stride, T.numel, T.nelement, T.is_floating_point, T.is_complex,
    T.element_size, T.__len__, T.is_contiguous, T.get_device, torch.numel,
    torch.is_floating_point, torch.is_complex, torch.is_tensor, T.is_signed,
}  # fmt: skip

# Calls whose result is tensor data turned into Python values.
_DATA_DEPENDENT = {
    T.__bool__: "converts a tensor to a Python bool",
    T.item: "reads a tensor element as a Python number (Tensor.item)",
    T.tolist: "converts a tensor to Python numbers (Tensor.tolist)",
    T.__int__: "converts a tensor to a Python int",
    T.__float__: "converts a tensor to a Python float",
    T.__index__: "uses a tensor as a Python index",
    T.__complex__: "converts a tensor to a Python complex",
    T.numpy: "converts a tensor to a NumPy array",
    T.__array__: "converts a tensor to a NumPy array",
    T.__contains__: "tests membership in a tensor (`in`)",
    T.nonzero: "has an output shape that depends on tensor values (nonzero)",
    torch.nonzero: "has an output shape that depends on tensor values (nonzero)",
    torch.argwhere: "has an output shape that depends on tensor values (argwhere)",
    torch.masked_select: "has an output shape that depends on tensor values (masked_select)",
    T.masked_select: "has an output shape that depends on tensor values (masked_select)",
    torch.unique: "has an output shape that depends on tensor values (unique)",
    T.unique: "has an output shape that depends on tensor values (unique)",
    torch.unique_consecutive: "has an output shape that depends on tensor values (unique_consecutive)",
    T.unique_consecutive: "has an output shape that depends on tensor values (unique_consecutive)",
    torch.bincount: "has an output shape that depends on tensor values (bincount)",
    T.bincount: "has an output shape that depends on tensor values (bincount)",
}


# ``torch.rand`` draws lie in [0, 1) in every floating dtype. A comparison of such a draw with a
# number can hold, or fail, for every value drawn (HF's layer drop: ``torch.rand([]) < 0.0``).
_UNIT_INTERVAL_DRAWS = {torch.rand, torch.rand_like}
_COMPARISONS = {
    torch.lt: "lt", T.lt: "lt", T.__lt__: "lt", torch.less: "lt", T.less: "lt",
    torch.le: "le", T.le: "le", T.__le__: "le", torch.less_equal: "le", T.less_equal: "le",
    torch.gt: "gt", T.gt: "gt", T.__gt__: "gt", torch.greater: "gt", T.greater: "gt",
    torch.ge: "ge", T.ge: "ge", T.__ge__: "ge", torch.greater_equal: "ge", T.greater_equal: "ge",
}  # fmt: skip


def _decided_for_a_draw(comparison: str, number, dtype: torch.dtype) -> bool | None:
    """The result of ``draw <comparison> number`` for every ``draw`` of ``torch.rand`` in
    ``dtype``, if one result holds for them all, else None.

    Eager compares in the draw's dtype, rounding the number: a small negative number may round
    to -0.0 (so "below zero" needs ``-tiny``), a number just above 1 to 1.0 (so "above every
    draw" needs 2; the bounds are taken as [0, 1], draws below 1 or equal to it alike)."""
    if type(number) not in (int, float) or number != number:  # NaN: left to the general rule
        return None
    negative = number <= -torch.finfo(dtype).tiny
    decided = {
        "lt": False if number <= 0 else True if number >= 2 else None,
        "le": False if negative else True if number >= 1 else None,
        "gt": True if negative else False if number >= 1 else None,
        "ge": True if number <= 0 else False if number >= 2 else None,
    }
    return decided[comparison]


def data_dependent_error(what: str) -> DataDependentError:
    where = user_location()
    place = f"{where.filename}:{where.lineno}: `{where.line}`" if where else "the captured function"
    inner = calling_location()
    if (
        inner is not None
        and where is not None
        and (inner.filename, inner.lineno) != (where.filename, where.lineno)
    ):
        place += f", in {inner.filename}:{inner.lineno}: `{inner.line}`,"  # a library's own line
    return DataDependentError(
        f"{place} {what}, so the program depends on the values inside a tensor.\n"
        "thunder_core.jit specializes on shapes, dtypes and Python values, never on tensor data. "
        "Ways out:\n"
        "  1. compute both branches and pick per element with torch.where(condition, a, b);\n"
        "  2. make the decision outside the jitted function and pass it in as a Python bool or "
        "number (the trace is specialized on it);\n"
        "  3. leave this function (or this part of it) un-jitted."
    )


# Where a tensor's data lies in its storage: not part of what a trace is specialized on.
_STORAGE_QUERIES = {
    T.storage_offset: "reads a tensor's storage offset (Tensor.storage_offset)",
    T.data_ptr: "reads a tensor's data address (Tensor.data_ptr)",
    T.untyped_storage: "reads a tensor's storage (Tensor.untyped_storage)",
}


def storage_query_error(what: str) -> CaptureError:
    where = user_location()
    place = f"{where.filename}:{where.lineno}: `{where.line}`" if where else "the captured function"
    return CaptureError(
        f"{place} {what}. thunder_core.jit specializes a trace on shapes, strides, dtypes and devices, not on "
        "where the data lies in memory, so the value read while capturing could be wrong on a later call. "
        "Ways out: compute from sizes and strides instead (Tensor.stride(), Tensor.is_contiguous()), or "
        "leave this function (or this part of it) un-jitted."
    )


_functorch_level = torch._C._functorch.peek_interpreter_stack


def functorch_transform_error() -> CaptureError:
    where = user_location()
    place = f"{where.filename}:{where.lineno}: `{where.line}`" if where else "the captured function"
    return CaptureError(
        f"{place} runs inside a torch.func transform (vmap, grad, jvp, ...) that the jitted function "
        "calls; thunder_core.jit does not capture through torch.func transforms (it records "
        "torch.vmap only when the code looks it up while being captured, not a function mapped "
        "before). Ways out: use thunder_core's own transforms inside (thunder_core.vmap, grad, vjp, "
        "jvp), apply the transform to a jitted function instead (torch.func.vmap(thunder_core.jit(f)) "
        "works), or leave this function (or this part of it) un-jitted."
    )


class CaptureMode(TorchFunctionMode):
    """Routes torch calls to thunder_core symbols; unknown ones become opaque calls.

    ``lift`` maps a real tensor (one not made during capture) to the proxy that stands for it.
    """

    def __init__(self, lift=None):
        super().__init__()
        self._lift = lift
        # The result of the last torch call when it was a ``torch.rand`` draw, and the result of
        # the last call when it compared that draw with a number its bounds decide. Only the
        # very last call counts: any call in between may have written either in place (through
        # a view, an ``out=``, an augmented assignment) or read the comparison otherwise.
        self._draw: TensorProxy | None = None
        self._decided: tuple[TensorProxy, bool] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _functorch_level() is not None:  # a torch.func transform the captured function started
            raise functorch_transform_error()
        if func in _METADATA:
            return func(*args, **kwargs)
        draw, decided, self._draw, self._decided = self._draw, self._decided, None, None
        if func is T.__bool__ and decided is not None and decided[0] is args[0]:
            # HF's layer drop, `if torch.rand([]) < self.layerdrop:` with layerdrop 0.0: the same
            # answer for any value drawn, so nothing depends on the data (the draw stays in the
            # trace, advancing the generator as in eager).
            return decided[1]
        reason = _DATA_DEPENDENT.get(func)
        if reason is not None:
            raise data_dependent_error(reason)
        reason = _STORAGE_QUERIES.get(func)
        if reason is not None and any(isinstance(a, TensorProxy) for a in args):
            raise storage_query_error(reason)
        if self._lift is not None:
            args, kwargs = tree_map(self._lift, args), tree_map(self._lift, kwargs)
        if func is T.__repr__ or func is T.__format__ or func is T.__str__:
            return repr(args[0]) if isinstance(args[0], TensorProxy) else func(*args, **kwargs)
        if func is T.__iter__:
            return (
                iter(_dispatch(torch.unbind, (args[0], 0), {}))
                if isinstance(args[0], TensorProxy)
                else func(*args)
            )
        result = _dispatch(func, args, kwargs)
        if isinstance(result, TensorProxy) and "out" not in kwargs:
            if func in _UNIT_INTERVAL_DRAWS and result.dtype.is_floating_point:
                self._draw = result
            elif func in _COMPARISONS and len(args) == 2 and draw is not None and args[0] is draw:
                truth = _decided_for_a_draw(_COMPARISONS[func], args[1], draw.dtype)
                if truth is not None and _one_element(result):
                    self._decided = (result, truth)
        return result


def _one_element(proxy: TensorProxy) -> bool:
    return all(type(n) is int for n in proxy.shape) and math.prod(proxy.shape) == 1


def _plain_number(x):
    """An ``IntEnum``/``IntFlag`` member (or another subclass of a Python number) as the plain
    number torch takes it for: the trace prints and decomposes plain numbers only."""
    if type(x) in (bool, int, float, complex) or not isinstance(x, (int, float, complex)):
        return x
    for kind in (int, float, complex):  # bool cannot be subclassed
        if isinstance(x, kind):
            return kind(x)
    return x


def _dispatch(func, args, kwargs):
    args, kwargs = tree_map(_plain_number, args), tree_map(_plain_number, kwargs)
    if kwargs.get("out") is not None:  # writes into a given tensor: an in-place call, run as written
        return opaque_symbol(func, kwargs)(*args, **kwargs)
    entry = lookup(func)
    if entry is not None:
        symbol, adapter = entry
        if adapter is not None:
            args, kwargs = adapter(args, kwargs)
        return symbol(*args, **kwargs)
    return opaque_symbol(func, kwargs)(*args, **kwargs)
