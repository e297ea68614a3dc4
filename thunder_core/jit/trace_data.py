"""A captured trace as plain JSON data, and back: what the on-disk cache stores.

Only what can be rebuilt exactly in another process is written: bound symbols whose symbol is
a prim, a registered torch-level symbol, an opaque torch callable with a public path, a
recorded block call or ``del``; proxies with their metadata; Python literals, dtypes,
devices, sizes, slices and containers of them; source locations; the output's pytree
structure where ``torch.utils._pytree`` can serialize it. Anything else (a hook, a user's
``autograd.Function``, a real tensor constant, symbolic sizes, an object argument the program
changes) raises ``NotPersistable`` naming it, and the trace is simply not stored. Nothing is
unpickled: symbols are looked up in the tables that registered them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from thunder_core.capture.blocks import BLOCK, block_symbol
from thunder_core.ir.proxies import NumberProxy, ObjectProxy, TensorProxy
from thunder_core.ir.symbols import OPAQUE, BoundSymbol, SourceLocation, Symbol, delete_symbol
from thunder_core.ir.trace import Trace
from thunder_core.ops.prims import PRIMS
from thunder_core.ops.registry import TORCH_SYMBOLS, opaque_symbol, torch_path


class NotPersistable(Exception):
    """The trace holds something another process could not rebuild exactly."""


_DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_FORMATS = {str(m): m for m in vars(torch).values() if isinstance(m, (torch.memory_format, torch.layout))}


# Symbols.
def _symbol_data(symbol: Symbol, kwargs: dict) -> list:
    if symbol is delete_symbol:
        return ["del"]
    if symbol.plain is not None:  # an operation of a no_grad region (capture.grad_mode)
        return ["no_grad", *_symbol_data(symbol.plain, kwargs)]
    if symbol.is_prim and PRIMS.get(symbol.name) is symbol:
        return ["prim", symbol.name]
    if TORCH_SYMBOLS.get(symbol.name) is symbol:
        return ["torch", symbol.name]
    if symbol.has_tag(BLOCK):
        return ["block", symbol.printed_name.removeprefix("block_of_")]
    if symbol.has_tag(OPAQUE):
        path = torch_path(symbol.impl)
        if (
            path is not None
            and _resolve(path) is symbol.impl
            and opaque_symbol(symbol.impl, kwargs) is symbol
        ):
            return ["opaque", path]
    raise NotPersistable(f"the operation {symbol.printed_name} is not a registered or public torch operation")


def _resolve(path: str):
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _symbol_from(data: list, kwargs: dict) -> Symbol:
    kind = data[0]
    if kind == "del":
        return delete_symbol
    if kind == "no_grad":
        from thunder_core.capture.grad_mode import without_grad

        return without_grad(_symbol_from(data[1:], kwargs))
    if kind == "prim":
        return PRIMS[data[1]]
    if kind == "torch":
        return TORCH_SYMBOLS[data[1]]
    if kind == "block":
        return block_symbol(data[1])
    if kind == "opaque":
        fn = _resolve(data[1])
        if fn is None:
            raise KeyError(f"no torch callable {data[1]}")
        return opaque_symbol(fn, kwargs)
    raise KeyError(f"unknown symbol kind {kind!r}")


# Values.
class _Writer:
    def __init__(self, claimed: bool = False):
        self.claimed = claimed  # bound symbols given to executors are written with their executor's name
        self.proxies: dict[str, list] = {}  # name -> metadata, each proxy once
        self._objects: dict[str, int] = {}  # name -> id of the proxy object that has it

    def proxy(self, p) -> dict:
        seen = self._objects.setdefault(p.name, id(p))
        if seen != id(p):
            raise NotPersistable(f"two values are named {p.name}")
        if p.name not in self.proxies:
            if isinstance(p, TensorProxy):
                if any(not isinstance(s, int) for s in (*p.shape, *p.stride())):
                    raise NotPersistable("the trace has symbolic sizes")
                self.proxies[p.name] = [
                    "T", list(p.shape), list(p.stride()), str(p.dtype), str(p.device), bool(p.requires_grad)
                ]  # fmt: skip
            elif isinstance(p, NumberProxy):
                self.proxies[p.name] = ["N", self.value(p.value)]
            else:
                self.proxies[p.name] = ["O"]
        return {"p": p.name}

    def value(self, x) -> Any:
        if isinstance(x, (TensorProxy, NumberProxy, ObjectProxy)):
            return self.proxy(x)
        if x is None or type(x) in (bool, int, str):
            return x
        if type(x) is float:
            return x if math.isfinite(x) and not (x == 0.0 and math.copysign(1.0, x) < 0) else {"f": repr(x)}
        if type(x) is complex:
            return {"c": [self.value(x.real), self.value(x.imag)]}
        if isinstance(x, torch.dtype):
            return {"dtype": str(x)}
        if isinstance(x, torch.device):
            return {"device": str(x)}
        if isinstance(x, (torch.memory_format, torch.layout)):
            return {"format": str(x)}
        if type(x) is torch.Size:
            return {"size": [self.value(s) for s in x]}
        if x is Ellipsis:
            return {"ellipsis": True}
        if type(x) is slice:
            return {"slice": [self.value(x.start), self.value(x.stop), self.value(x.step)]}
        if type(x) is tuple:
            return {"tuple": [self.value(item) for item in x]}
        if type(x) is list:
            return [self.value(item) for item in x]
        if type(x) is dict and all(type(k) is str for k in x):
            return {"dict": {k: self.value(v) for k, v in x.items()}}
        if isinstance(x, tuple) and type(x).__module__ == "torch.return_types":
            return {"return_type": type(x).__name__, "items": [self.value(item) for item in x]}
        raise NotPersistable(f"the trace holds a {type(x).__qualname__} value")

    def bound_symbol(self, bsym: BoundSymbol) -> dict:
        if bsym.impl is not None or (bsym.executor is not None and not self.claimed):
            raise NotPersistable("the trace was already given to executors")
        data = {
            "s": _symbol_data(bsym.symbol, bsym.kwargs),
            "a": self.value(tuple(bsym.args)),
            "k": self.value(dict(bsym.kwargs)),
            "o": self.value(bsym.output),
        }
        if bsym.executor is not None:
            data["x"] = bsym.executor
        if bsym.subsymbols:
            data["sub"] = [self.bound_symbol(b) for b in bsym.subsymbols]
        if bsym.source is not None:
            s = bsym.source
            data["src"] = [s.filename, s.lineno, s.function, s.line]
        return data


class _Reader:
    def __init__(self, proxies: dict[str, list]):
        self._data = proxies
        self._made: dict[str, Any] = {}

    def proxy(self, name: str):
        made = self._made.get(name)
        if made is None:
            kind = self._data[name]
            if kind[0] == "T":
                _, shape, stride, dtype, device, requires_grad = kind
                made = TensorProxy(name, shape, _DTYPES[dtype], torch.device(device), requires_grad, stride)
            elif kind[0] == "N":
                made = NumberProxy(name, self.value(kind[1]))
            else:
                made = ObjectProxy(name)
            self._made[name] = made
        return made

    def value(self, x) -> Any:
        if x is None or type(x) in (bool, int, float, str):
            return x
        if type(x) is list:
            return [self.value(item) for item in x]
        (tag, body), *_ = x.items()
        if tag == "p":
            return self.proxy(body)
        if tag == "f":
            return float(body)
        if tag == "c":
            return complex(self.value(body[0]), self.value(body[1]))
        if tag == "dtype":
            return _DTYPES[body]
        if tag == "device":
            return torch.device(body)
        if tag == "format":
            return _FORMATS[body]
        if tag == "size":
            return torch.Size(self.value(s) for s in body)
        if tag == "ellipsis":
            return Ellipsis
        if tag == "slice":
            return slice(*(self.value(part) for part in body))
        if tag == "tuple":
            return tuple(self.value(item) for item in body)
        if tag == "dict":
            return {k: self.value(v) for k, v in body.items()}
        if tag == "return_type":
            return getattr(torch.return_types, body)([self.value(item) for item in x["items"]])
        raise KeyError(f"unknown value tag {tag!r}")

    def bound_symbol(self, data: dict) -> BoundSymbol:
        kwargs = self.value(data["k"])
        source = SourceLocation(*data["src"]) if "src" in data else None
        return BoundSymbol(
            _symbol_from(data["s"], kwargs),
            self.value(data["a"]),
            kwargs,
            self.value(data["o"]),
            [self.bound_symbol(b) for b in data.get("sub", ())],
            source,
        )


def trace_to_data(trace: Trace, claimed: bool = False) -> dict:
    """``trace`` as JSON-serializable data; raises ``NotPersistable`` where that cannot be exact.
    ``claimed``: the bound symbols may name the executor they were given to (a fusion region's),
    as long as none carries a callable of its own; such data describes, it is not read back."""
    if trace.epilogue is not None:
        raise NotPersistable(
            "the function changes its argument objects, or returns objects (its arguments, or ones it makes)"
        )
    writer = _Writer(claimed)
    inputs = [writer.proxy(p)["p"] for p in trace.inputs]
    bound_symbols = [writer.bound_symbol(b) for b in trace.bound_symbols]
    output = writer.value(trace.output)
    treespec = None
    if trace.output_treespec is not None:
        from torch.utils._pytree import treespec_dumps

        try:
            treespec = treespec_dumps(trace.output_treespec)
        except Exception as error:  # noqa: BLE001 - a container type pytree cannot name
            raise NotPersistable(f"the output's structure cannot be serialized ({error})") from None
    return {
        "proxies": writer.proxies,
        "inputs": inputs,
        "bound_symbols": bound_symbols,
        "output": output,
        "function_name": trace.function_name,
        "treespec": treespec,
    }


def trace_from_data(data: dict) -> Trace:
    """The trace ``trace_to_data`` described (raises KeyError/TypeError/ValueError on bad data)."""
    reader = _Reader(data["proxies"])
    treespec = None
    if data["treespec"] is not None:
        from torch.utils._pytree import treespec_loads

        treespec = treespec_loads(data["treespec"])
    return Trace(
        inputs=[reader.proxy(name) for name in data["inputs"]],
        bound_symbols=[reader.bound_symbol(b) for b in data["bound_symbols"]],
        output=reader.value(data["output"]),
        function_name=data["function_name"],
        output_treespec=treespec,
    )
