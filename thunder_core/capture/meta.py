"""Output metadata of an operation, found by running it on the meta device.

Proxies become meta tensors of the same shape, strides, dtype and requires_grad; real
tensors (constants) are moved to meta; an explicit ``device=`` becomes ``"meta"``. The
outputs are turned back into proxies on the device the real call would produce.

Results are memoized on the call's metadata (a transformer repeats the same ops on the same
shapes in every layer), so each distinct call runs on meta once per process. With symbolic
sizes, on fake tensors, the memo is the capture's own (its sizes are its ``ShapeEnv``'s
expressions), and outputs with sizes no input determines (``nonzero``) are not memoized.
"""

from __future__ import annotations

import contextlib

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._python_dispatch import TorchDispatchMode

from thunder_core.capture import symbolic
from thunder_core.capture.symbolic_python import kernels_running
from thunder_core.capture.without_dynamo import before_python_meta_kernels
from thunder_core.errors import CaptureError
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbolic import same_sizes
from thunder_core.ir.tree import leaves, tree_map
from thunder_core.ops import kept_answers
from thunder_core.ops.kept_answers import NotKept, TensorSpec


def _target_device(args, kwargs) -> torch.device:
    explicit = kwargs.get("device")
    if explicit is not None:
        return torch.device(explicit)
    positional = next((x for x in args if isinstance(x, torch.device)), None)
    if positional is not None:  # prims.full(shape, value, dtype, device), Tensor.to(device)
        return positional
    real = None
    stack = [args, kwargs]
    while stack:
        x = stack.pop(0)
        if isinstance(x, TensorProxy):
            return x.device
        if isinstance(x, torch.Tensor) and real is None:
            real = x.device
        elif isinstance(x, (tuple, list)):
            stack[:0] = list(x)
        elif isinstance(x, dict):
            stack[:0] = list(x.values())
    return real if real is not None else torch.get_default_device()


def _sample(x, fill=None):
    if isinstance(x, TensorProxy) and fill is not None:
        return torch.full(x.shape, fill, dtype=x.dtype)
    if isinstance(x, TensorProxy):
        if x.dtype.is_floating_point or x.dtype.is_complex:
            sample = torch.rand(x.shape, dtype=x.dtype)  # in [0, 1): passes value checks such as weights >= 0
            # A proxy that requires grad: a non-leaf that does, so the outputs say whether they need one.
            return sample.requires_grad_().clone() if x.requires_grad else sample
        return torch.zeros(x.shape, dtype=x.dtype)
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    return x


def _run_on_sample_data(fn, args, kwargs):
    """Outputs of ``fn`` on random CPU stand-ins, for ops that have no meta kernel.

    Only tensor outputs are trusted: a Python value computed this way would be a guess
    about the real data, so it is refused as data-dependent.
    """
    from thunder_core.capture.mode import data_dependent_error

    def run(sample):
        with torch.random.fork_rng():
            return fn(
                *tree_map(sample, args),
                **{k: ("cpu" if k == "device" else tree_map(sample, v)) for k, v in kwargs.items()},
            )

    out = run(_sample)
    if not any(isinstance(y, torch.Tensor) for y in leaves(out)):
        raise data_dependent_error(
            f"computes a Python value from tensor data ({getattr(fn, '__name__', fn)})"
        )
    # Output sizes that follow the values (a boolean mask's True count: x[mask]) would be a
    # guess frozen into the trace: the op runs again on inputs of all zeros and all ones.
    for fill in (0, 1):
        try:
            other = run(lambda x, fill=fill: _sample(x, fill))
        except Exception:  # noqa: BLE001 - such values are not valid inputs (an index past the end)
            continue
        if _layouts(other) != _layouts(out):
            raise data_dependent_error(
                f"has an output shape that depends on tensor values ({getattr(fn, '__name__', fn)}; "
                "a boolean mask as an index is one: torch.where or masked_fill keep the shape, and "
                'loss[valid].mean() is (loss * valid).sum() / valid.sum(); torch.compile(backend="thunder_core") '
                "runs such an operation eagerly)"
            )
    return tree_map(lambda y: y.to("meta") if isinstance(y, torch.Tensor) else y, out)


def _layouts(out) -> list:
    return [(tuple(y.shape), y.stride(), y.dtype) for y in leaves(out) if isinstance(y, torch.Tensor)]


class _NotMemoizable(Exception):
    pass


_IMMUTABLE = (int, float, bool, str, type(None), torch.dtype, torch.device)
_MEMO_LIMIT = 50_000
_memo: dict[tuple, object] = {}


def _size_key(size):
    """A size as a key: an int, or a symbolic size's expression in its ``ShapeEnv``."""
    return size if type(size) is int else (type(size), size.node.expr)


def _memo_key(fn, args, kwargs, *, symbolic: bool = False) -> tuple:
    """The call's identity up to proxy names; _NotMemoizable for constants or unhashable values.
    ``symbolic``: sizes may be symbolic (keyed by their expressions)."""
    positions: dict[int, int] = {}  # which arguments are the same proxy is part of the key
    parts: list = []

    def walk(x) -> None:
        if isinstance(x, TensorProxy):
            index = positions.setdefault(id(x), len(positions))
            shape, stride = x.shape, x.stride()
            if symbolic:
                shape, stride = tuple(map(_size_key, shape)), tuple(map(_size_key, stride))
            parts.append((index, shape, stride, x.dtype, x.device, x.requires_grad))
        elif symbolic and isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            parts.append(_size_key(x))
        elif isinstance(x, (tuple, list)):
            parts.append((type(x), len(x)))
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            parts.append((dict, tuple(x)))
            for y in x.values():
                walk(y)
        elif isinstance(x, slice):
            parts.append((slice, x.start, x.stop, x.step))
        elif isinstance(x, _IMMUTABLE) or x is Ellipsis:
            parts.append((type(x), x))
        else:
            raise _NotMemoizable

    walk(args)
    walk(kwargs)
    state = (
        torch.is_grad_enabled(),
        torch.get_default_dtype(),
        str(torch.get_default_device()),
        torch.is_autocast_enabled("cpu"),
        torch.is_autocast_enabled("cuda"),
    )
    return (fn, state, tuple(parts))


def _question(memo_key: tuple) -> str:
    """A memo key as text for the on-disk cache (NotKept for an operation with no stable name)."""
    fn, state, parts = memo_key
    return repr(("meta", kept_answers.function_name(fn), state, parts))


def _kept_answer(memo_key: tuple):
    try:
        return kept_answers.lookup(_question(memo_key))
    except NotKept:
        return None


def _spec(out):
    """``out`` with tensors as specs; _NotMemoizable if it holds anything else mutable, or a size
    no input determines (a new unbacked symbol on every call)."""

    def one(y):
        if isinstance(y, torch.Tensor):
            if any(type(s) is not int and s.node.expr.free_symbols for s in (*y.shape, *y.stride())):
                from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

                if free_unbacked_symbols(y):
                    raise _NotMemoizable
            return TensorSpec.of(y)
        if isinstance(y, _IMMUTABLE) or isinstance(y, torch.Size):
            return y
        raise _NotMemoizable

    return tree_map(one, out)


def run_on_meta(fn, args: tuple, kwargs: dict, new_proxy, *, inplace: bool):
    """Call ``fn`` on meta stand-ins of ``args``; return outputs as proxies.

    For in-place calls an output that is the very meta tensor of an input proxy is
    returned as that proxy (with its requires_grad updated); otherwise every output
    tensor becomes a new proxy made by ``new_proxy``.
    """
    device = _target_device(args, kwargs)
    key = None
    sizes = symbolic.sizes_of(leaves((args, kwargs)))
    memo = _memo if sizes is None else sizes.memo
    if not inplace:
        try:
            key = _memo_key(fn, args, kwargs, symbolic=sizes is not None)
            spec = memo.get(key)
            if spec is None and sizes is None:
                spec = _kept_answer(key)
                if spec is not None:
                    _memo[key] = spec
        except (_NotMemoizable, TypeError):  # TypeError: an unhashable value inside a tuple
            key = None
        else:
            if spec is not None:
                return tree_map(
                    lambda y: (
                        new_proxy(y.shape, y.dtype, device, y.requires_grad, y.stride)
                        if isinstance(y, TensorSpec)
                        else y
                    ),
                    spec,
                )
    same = None if sizes is not None or inplace else _same_layout_elementwise(fn, args, kwargs)
    if same is not None:
        out, by_meta = same, {}
    elif sizes is not None:
        out, by_meta = _fake_outputs(sizes, fn, args, kwargs, reuse=not inplace)
    else:
        out, by_meta = _meta_outputs(fn, args, kwargs)
    if key is not None:
        try:
            spec = _spec(out)
        except _NotMemoizable:
            pass
        else:
            if len(memo) >= _MEMO_LIMIT:
                memo.clear()
            memo[key] = spec
            if sizes is None:
                with contextlib.suppress(NotKept):
                    kept_answers.remember(_question(key), spec)

    def to_proxy(y):
        if not isinstance(y, torch.Tensor):
            return y
        if inplace and id(y) in by_meta:
            proxy, made = by_meta[id(y)]
            if _sizes_text(y.shape, y.stride()) != _sizes_text(*made):
                raise _metadata_changed(fn, proxy, y, resized_out=kwargs.get("out") is proxy)
            if y.requires_grad and not proxy.requires_grad:
                proxy.requires_grad_(True)
            return proxy
        proxy = new_proxy(y.shape, y.dtype, device, y.requires_grad, y.stride())
        if sizes is not None and not inplace and y.device == proxy.device:
            sizes.remember(proxy, y)
        return proxy

    return tree_map(to_proxy, out)


#: Binary elementwise operations whose result, for two tensors of one dtype (not bool), shape,
#: device and contiguous layout, is a contiguous tensor of that dtype and shape.
_SAME_LAYOUT_OPERATIONS = frozenset(
    {torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum}
    | {getattr(torch.Tensor, name) for name in ("add", "sub", "mul", "__add__", "__sub__", "__mul__")}
)


def _same_layout_elementwise(fn, args: tuple, kwargs: dict):
    """The output of ``a + b`` (and the like) on two tensors of the same metadata, as a meta
    tensor, without running PyTorch's Python meta kernel: its type promotion imports sympy
    (0.35 s) on the first call of a process. None for anything else (the meta kernel decides)."""
    if fn not in _SAME_LAYOUT_OPERATIONS or kwargs or len(args) != 2:
        return None
    a, b = args
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    shape, dtype = tuple(a.shape), a.dtype
    if not all(type(size) is int for size in (*shape, *b.shape)):  # symbolic: the meta kernel decides
        return None
    if tuple(b.shape) != shape or b.dtype != dtype or dtype == torch.bool or a.device != b.device:
        return None
    out = torch.empty(shape, dtype=dtype, device="meta")  # contiguous (PyTorch's rule imports sympy)
    if tuple(a.stride()) != out.stride() or tuple(b.stride()) != out.stride():
        return None
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        out.requires_grad_(True)
    return out


class _StandIns:
    """One stand-in tensor per input proxy of an operation (made by ``make``), remembered so the
    same proxy passed twice is the same stand-in; a proxy that requires grad gets a non-leaf, so
    an in-place op is judged as on an intermediate (a real leaf that requires grad still raises
    at run time exactly as in eager)."""

    def __init__(self, make, mode=contextlib.nullcontext):
        self._make, self._mode = make, mode
        self._made: dict[int, tuple[torch.Tensor, TensorProxy]] = {}

    def __call__(self, proxy: TensorProxy) -> torch.Tensor:
        found = self._made.get(id(proxy))
        if found is not None:
            return found[0]
        stand_in = self._make(proxy)
        if proxy.requires_grad and stand_in.grad_fn is None:  # not an operation's output that requires it
            with self._mode():
                stand_in = stand_in.requires_grad_().clone()
        self._made[id(proxy)] = (stand_in, proxy, (tuple(stand_in.shape), tuple(stand_in.stride())))
        return stand_in

    def proxies(self) -> dict[int, tuple[TensorProxy, tuple[str, ...]]]:
        """The input proxy behind each stand-in, with the stand-in's ``(sizes, strides)`` as it
        was made, by the stand-in's id."""
        return {id(stand_in): (proxy, made) for stand_in, proxy, made in self._made.values()}


def _fake_outputs(sizes: symbolic.SymbolicSizes, fn, args: tuple, kwargs: dict, *, reuse: bool):
    """``fn``'s outputs on fake tensors of a symbolic capture (sizes stay symbolic), and the input
    proxy behind each fake (by id). With ``reuse``, an input made by an earlier operation of the
    capture is that operation's fake output (an in-place operation gets new ones: it changes them)."""
    fakes = _StandIns(sizes.stand_in if reuse else sizes.fake, lambda: sizes.fake_mode)

    def to_fake(x):
        if isinstance(x, TensorProxy):
            return fakes(x)
        if isinstance(x, torch.Tensor):
            constant = sizes.fake_mode.from_tensor(x.detach())
            return constant.requires_grad_(x.requires_grad and x.is_floating_point())
        return x

    fake_args, fake_kwargs = tree_map(to_fake, args), tree_map(to_fake, kwargs)
    before_python_meta_kernels()
    # The Python dispatcher, as Dynamo runs its fake tensors: composite operations and metas run
    # PyTorch's Python kernels, which take symbolic sizes. Some of their C++ kernels do not (the
    # CUDA attention mask's constant_pad_nd, matmul's fold check in torch 2.11).
    with sizes.fake_mode, enable_python_dispatcher(), kernels_running():
        out = fn(*fake_args, **fake_kwargs)
    return out, fakes.proxies()


def _meta_outputs(fn, args: tuple, kwargs: dict):
    """``fn``'s outputs on meta stand-ins, and the input proxy behind each stand-in (by id)."""
    metas = _StandIns(_meta_like)

    def to_meta(x):
        if isinstance(x, TensorProxy):
            return metas(x)
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            return x.detach().to("meta").requires_grad_(x.requires_grad and x.is_floating_point())
        if isinstance(x, torch.device) and x.type != "meta":
            return torch.device("meta")  # a device passed positionally (prims.full): nothing allocated
        return x

    meta_args = tree_map(to_meta, args)
    meta_kwargs = {
        k: ("meta" if k == "device" and v is not None else tree_map(to_meta, v)) for k, v in kwargs.items()
    }
    before_python_meta_kernels()
    stray = (
        _StrayTensorsAsMeta()
        if getattr(fn, "reads_tensors_it_is_not_given", False)
        else contextlib.nullcontext()
    )
    try:
        with torch.device("meta"), stray:
            out = fn(*meta_args, **meta_kwargs)
    except NotImplementedError:
        # No meta kernel: learn the output metadata from a run on sample CPU data.
        out = _run_on_sample_data(fn, args, kwargs)
    return out, metas.proxies()


class _StrayTensorsAsMeta(TorchDispatchMode):
    """For a callable that reads tensors it is not given (an ``autograd.Function`` whose forward
    uses a module's parameter: a proxy while the module is captured, a real tensor after): every
    operation computes on meta tensors of its tensors' metadata. Only output metadata is wanted
    here, and a real tensor is never changed in place by this run (a BatchNorm's
    ``num_batches_tracked.add_(1)``: the program's run does that once)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(_meta_of_stray, (args, kwargs or {}))
        return func(*args, **kwargs)


def _meta_of_stray(x):
    if isinstance(x, torch.Tensor) and (isinstance(x, TensorProxy) or x.device.type != "meta"):
        return _meta_like(x)
    return x


def _meta_like(x: torch.Tensor) -> torch.Tensor:
    """An empty meta tensor with ``x``'s sizes, strides and dtype."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


def _sizes_text(shape, stride) -> tuple[str, ...]:
    """Sizes and strides as text, compared without guards on symbolic sizes: a symbolic one in
    its ``ShapeEnv``'s current terms (an operation may have found two symbols equal since)."""
    return (*map(_size_text, shape), "/", *map(_size_text, stride))


def _size_text(size) -> str:
    if isinstance(size, torch.SymInt):
        return str(size.node.shape_env.replace(size.node.expr))
    return str(size)


def _metadata_changed(fn, proxy, after, *, resized_out: bool) -> CaptureError:
    from thunder_core.ops.registry import torch_path

    name = torch_path(fn) or getattr(fn, "__name__", None) or repr(fn)
    name = name.removeprefix("aten::").split(".default")[0].replace("TensorBase.", "Tensor.")
    change = f"{tuple(proxy.shape)} -> {tuple(after.shape)}"
    if same_sizes(proxy.shape, after.shape):
        change = f"strides {tuple(proxy.stride())} -> {tuple(after.stride())}"
    if resized_out:
        return CaptureError(
            f"{name}(..., out=...) would resize its out= tensor ({change}), which thunder_core cannot "
            "capture: pass an out= tensor of the result's size, or drop out= and use the result"
        )
    outplace = name.rsplit(".", 1)[-1].removesuffix("_")
    return CaptureError(
        f"{name} changes the sizes or strides of a tensor in place ({change}), which thunder_core "
        f"cannot capture: use the out-of-place form (y = y.{outplace}(...)) instead, or run this code "
        "outside thunder_core.jit"
    )
