"""Proxies: named stand-ins for values while a program is captured.

A ``TensorProxy`` is a ``torch.Tensor`` wrapper subclass with real metadata (shape,
strides, dtype, device, requires_grad) and no storage, so user code can inspect it like a
tensor while every operation on it is intercepted and recorded.  A ``NumberProxy`` names a
Python number that the trace takes as an input and is specialized on.
"""

from __future__ import annotations

import torch

from thunder_core.ir.symbolic import hint, source

_SHORT_DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
    torch.complex128: "c128",
}


def short_dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"f32"``; unknown dtypes keep torch's own name."""
    return _SHORT_DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


class TensorProxy(torch.Tensor):
    """A tensor stand-in carrying shape, dtype, device and requires_grad, and a name."""

    @property
    def name(self) -> str:  # Tensor has its own read-only ``name``; this shadows it
        return self._proxy_name

    @staticmethod
    def __new__(
        cls,
        name: str,
        shape,
        dtype: torch.dtype,
        device: torch.device | str,
        requires_grad: bool = False,
        strides=None,
    ) -> TensorProxy:
        proxy = torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), strides=strides, dtype=dtype, device=device, requires_grad=requires_grad
        )
        proxy._proxy_name = name
        return proxy

    # Interception happens in the capture mode, never in the subclass.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(
            f"thunder_core: {func} reached a TensorProxy outside of capture. Proxies are only valid "
            "while thunder_core.jit captures a function; do not keep them after it returns."
        )

    def type_string(self) -> str:
        """``cpu f32[2, 3]``: what the printed trace shows for this value."""
        dims = ", ".join(source(s, strict=False) for s in self.shape)
        return f"{self.device} {short_dtype_name(self.dtype)}[{dims}]"

    @property
    def size_hint_bytes(self) -> int:
        """Bytes of the tensor, with each symbolic size at the value it had when captured."""
        count = 1
        for size in self.shape:
            count *= hint(size)
        return count * self.dtype.itemsize

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        grad = ", requires_grad" if self.requires_grad else ""
        return f'<TensorProxy {self.name}: "{self.type_string()}"{grad}>'

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)


class NumberProxy:
    """A Python number that is an input of a trace; the trace is specialized on its value,
    unless it holds a ``SymInt`` (an int compiled for changing values: its symbol, ``s2``)."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: int | float | bool | complex):
        self.name = name
        self.value = value

    @property
    def python_type(self) -> type:
        return type(self.value)

    def type_string(self) -> str:
        if isinstance(self.value, torch.SymInt):  # an int the trace takes symbolic
            return f"int {source(self.value, strict=False)}"
        return f"{self.python_type.__name__} = {self.value!r}"

    def __repr__(self) -> str:
        return f"<NumberProxy {self.name}: {self.type_string()}>"


class ObjectProxy:
    """A non-tensor value that flows between bound symbols, such as a saved autograd handle."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def type_string(self) -> str:
        return "object"

    def __repr__(self) -> str:
        return f"<ObjectProxy {self.name}>"


PROXY_TYPES = (TensorProxy, NumberProxy, ObjectProxy)


def is_proxy(value) -> bool:
    return isinstance(value, PROXY_TYPES)
