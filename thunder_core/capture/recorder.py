"""The recorder: turns symbol calls made during capture into bound symbols."""

from __future__ import annotations

import itertools
import os
from contextlib import contextmanager

import torch

from thunder_core.capture.grad_mode import as_recorded
from thunder_core.capture.meta import run_on_meta
from thunder_core.capture.reads import call_hook_slot
from thunder_core.errors import CaptureError, ThunderCoreError
from thunder_core.ir.proxies import PROXY_TYPES, TensorProxy
from thunder_core.ir.source import user_location
from thunder_core.ir.symbolic import same_sizes
from thunder_core.ir.symbols import EFFECT, INPLACE, OPAQUE, BoundSymbol, Symbol, pop_recorder, push_recorder
from thunder_core.ir.tree import leaves, tree_map
from thunder_core.ops._helpers import NoDecomposition
from thunder_core.ops.autocast_policy import DEVICE_TYPES, cast_inputs, proxy_device_type


def check_decompositions() -> bool:
    """``THUNDER_CORE_CHECK_DECOMPOSITIONS=1`` makes a failing decomposition an error (tests use it)."""
    return os.environ.get("THUNDER_CORE_CHECK_DECOMPOSITIONS", "") not in ("", "0")


class Namer:
    """Hands out the names ``t0, t1, ...`` for the intermediates of one trace."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self.counter = itertools.count()

    def __call__(self, prefix: str = "t") -> str:
        while True:
            name = f"{prefix}{next(self.counter)}"
            if name not in self.taken:
                self.taken.add(name)
                return name


def _proxies(tree) -> list:
    return [x for x in leaves(tree) if isinstance(x, PROXY_TYPES)]


# Factories whose output dtype and device come from ambient state (the default dtype and device)
# when not given: the recorded call names them, so a trace never depends on that state.
_FACTORIES = frozenset(
    {"zeros", "ones", "full", "empty", "rand", "randn", "randint", "randperm", "arange", "linspace",
     "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "empty_strided", "tril_indices",
     "triu_indices", "hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"}
)  # fmt: skip


# Torch calls whose effect is on capture itself, not on the program's data: grad mode switched
# by ``torch.no_grad()`` / ``enable_grad()`` (proxies carry the mode in force), and autocast
# turned on or off for a block, as Dynamo's graphs do it (the casts are recorded as they happen).
_EFFECTS_OF_CAPTURE = frozenset(
    {"_set_grad_enabled", "torch._C._set_grad_enabled", "_enter_autocast", "_exit_autocast"}
)


def _is_value(output) -> bool:
    """A plain answer (a metadata query's bool, int, size, dtype...), not None or a handle."""
    if type(output) in (tuple, list, torch.Size):
        return all(_is_value(x) for x in output)
    return output is not None and isinstance(output, _VALUES)


# Symbolic numbers count as values: size arithmetic (``torch.sym_sum``) on a capture's symbolic sizes.
_VALUES = (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format,
           torch.SymInt, torch.SymFloat, torch.SymBool)  # fmt: skip


def _effect_error(symbol: Symbol, output) -> CaptureError:
    where = user_location()
    place = f"{where.filename}:{where.lineno}: `{where.line}`" if where else "the captured function"
    got = "nothing" if output is None else f"a {type(output).__qualname__}"
    return CaptureError(
        f"{place} calls {symbol.printed_name}, which returns {got} and no tensor while capturing: it either acts "
        "on a tensor (an effect thunder_core has no record of, so later calls would not repeat it) or reads "
        "state a traced tensor does not have (.grad, .grad_fn). Ways out: make this call outside the jitted "
        "function, or leave this function un-jitted."
    )


def _same_metadata(a: TensorProxy, b: TensorProxy) -> bool:
    # guard-free first; shapes equal only for the captured sizes are compared as before, which
    # records the equality as a guard (the decomposition holds only then)
    shapes = same_sizes(a.shape, b.shape) or (a.ndim == b.ndim and a.shape == b.shape)
    return shapes and a.dtype == b.dtype and a.device == b.device


# What PyTorch's kernels say when they need a tensor's values (which meta tensors do not have).
_READS_DATA = (
    "item() cannot be called on meta",
    "a meta tensor without output_size",  # repeat_interleave by a tensor of repeats
    "should be a 1D CPU int64 tensor, but got 1D meta",  # pack_padded_sequence's lengths
)


def _reads_tensor_data(message: str) -> bool:
    return any(text in message for text in _READS_DATA) or "data-dependent" in message.lower()


_autocast_on = torch.is_autocast_enabled


def _autocast_casts(symbol: Symbol, args: tuple, kwargs: dict) -> tuple:
    """The operation's arguments with the casts ``torch.autocast`` (on right now, as the user's
    code left it: around the call or a block inside) makes before it, recorded as ``to`` calls
    ahead of it. The code after it sees the dtypes eager would, and the program holds every
    cast, so it runs with autocast off."""
    device_type = proxy_device_type(args, kwargs)
    if device_type not in DEVICE_TYPES or not _autocast_on(device_type):
        return args, kwargs
    return cast_inputs(symbol.name, device_type, torch.get_autocast_dtype(device_type), args, kwargs)


class Recorder:
    """Collects bound symbols; nested recorders collect decompositions (subsymbols)."""

    def __init__(self, namer: Namer, *, top_level: bool, grad_on_at_call: bool | None = None):
        self.namer = namer
        self.top_level = top_level
        # Grad mode when the captured function was called (capture.grad_mode)
        self.grad_on_at_call = torch.is_grad_enabled() if grad_on_at_call is None else grad_on_at_call
        self.bound_symbols: list[BoundSymbol] = []

    def new_proxy(self, shape, dtype, device, requires_grad=False, strides=None) -> TensorProxy:
        return TensorProxy(self.namer(), shape, dtype, device, requires_grad, strides)

    def outputs(self, symbol: Symbol, args: tuple, kwargs: dict):
        try:
            if symbol.meta is not None:
                return symbol.meta(*args, **kwargs)
            return run_on_meta(symbol.impl, args, kwargs, self.new_proxy, inplace=symbol.has_tag(INPLACE))
        except ThunderCoreError:
            raise
        except Exception as error:
            if _reads_tensor_data(str(error)):
                from thunder_core.capture.mode import data_dependent_error

                raise data_dependent_error(f"reads tensor data inside {symbol.printed_name}") from error
            if self.top_level:
                where = user_location()
                error.add_note(
                    f"thunder_core: raised while capturing {symbol.printed_name}"
                    + (f" at {where.filename}:{where.lineno}: `{where.line}`" if where else "")
                )
            raise

    def record(self, symbol: Symbol, args: tuple, kwargs: dict):
        # Recording is thunder_core's own code (decompositions, metadata on meta or fake tensors),
        # so it runs without capture's call hook (``reads.CallHook``), which watches the user's code:
        # the hook's call on every function and C call inside it dominated capture's time. What
        # user code runs in here (an autograd Function's forward on stand-ins) runs
        # again in the compiled program, so nothing it reads is frozen into the trace.
        get, install = call_hook_slot()
        hook = get()
        if hook is None or not callable(hook):  # nothing, or a C-level profiler (left as it is)
            return self._record(symbol, args, kwargs)
        install(None)
        try:
            return self._record(symbol, args, kwargs)
        finally:
            install(hook)

    def _record(self, symbol: Symbol, args: tuple, kwargs: dict):
        args = tree_map(lambda x: x, args)  # freeze the caller's lists
        kwargs = dict(kwargs)
        if self.top_level and (_autocast_on("cpu") or _autocast_on("cuda")):
            args, kwargs = _autocast_casts(symbol, args, kwargs)
        output = self.outputs(symbol, args, kwargs)
        if symbol.has_tag(OPAQUE) and not symbol.has_tag(INPLACE) and not _proxies(output):
            if not _is_value(output) and symbol.name not in _EFFECTS_OF_CAPTURE:
                raise _effect_error(symbol, output)
            return output  # a metadata query such as x.is_contiguous(): nothing to record
        if (
            symbol.name in _FACTORIES
            and not symbol.is_prim
            and isinstance(output, TensorProxy)
            and kwargs.get("out") is None
        ):
            if kwargs.get("dtype") is None:
                kwargs["dtype"] = output.dtype
            if kwargs.get("device") is None:
                kwargs["device"] = output.device
        if self.top_level:
            symbol = as_recorded(symbol, self.grad_on_at_call)  # a no_grad region's operations
        subsymbols = []
        if symbol.decomposition is not None and not symbol.has_tag(INPLACE):
            subsymbols = self.decompose(symbol, args, kwargs, output)
        source = user_location() if self.top_level else None
        recorded = None if symbol.has_tag(EFFECT) and not _proxies(output) else output  # a hook's handle
        self.bound_symbols.append(BoundSymbol(symbol, args, kwargs, recorded, subsymbols, source))
        return output

    def decompose(self, symbol: Symbol, args: tuple, kwargs: dict, output) -> list[BoundSymbol]:
        """Record ``symbol``'s decomposition, renamed to produce ``output``; [] if it does not fit."""
        inner = Recorder(self.namer, top_level=False)
        push_recorder(inner)
        try:
            decomposed = symbol.decomposition(*args, **kwargs)
        except NoDecomposition:
            return []
        except Exception as error:
            if check_decompositions():
                raise CaptureError(f"decomposition of {symbol.printed_name} failed: {error!r}") from error
            return []
        finally:
            pop_recorder()
        produced, expected = _proxies(decomposed), _proxies(output)
        inputs = {id(p) for p in _proxies((args, kwargs))}
        fits = len(produced) == len(expected) and all(
            isinstance(p, TensorProxy) and isinstance(e, TensorProxy) and _same_metadata(p, e)
            for p, e in zip(produced, expected)
        )
        if not fits or any(id(p) in inputs for p in produced):
            if check_decompositions() and not fits:
                got = [(p.shape, p.dtype) for p in produced if isinstance(p, TensorProxy)]
                want = [(e.shape, e.dtype) for e in expected if isinstance(e, TensorProxy)]
                raise CaptureError(f"decomposition of {symbol.printed_name} gave {got}, expected {want}")
            return []
        mapping = {id(p): e for p, e in zip(produced, expected)}
        return [bsym.substitute(mapping) for bsym in inner.bound_symbols]


@contextmanager
def record_scope(recorder: Recorder):
    """Make ``recorder`` the target of symbol calls for the duration of the block."""
    push_recorder(recorder)
    try:
        yield recorder
    finally:
        pop_recorder()
