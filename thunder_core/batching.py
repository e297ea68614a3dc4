"""Batching a recorded program over a leading batch dimension: ``vmap`` as a trace transform.

The function is recorded once on stand-ins of one example (the mapped dimension removed); each
recorded operation is then replayed on the batched values, which always carry the batch in
dimension 0. An operation none of whose inputs is batched is replayed as it is. Otherwise a
batching rule rewrites it (elementwise operations align the examples' ranks and broadcast; ops
that take dimensions get them shifted past the batch; ``linear`` and ``matmul`` of a batched
input by an unbatched weight are the same call; the prims' rules are in ``batching_prims``). An
operation without a rule is batched through its recorded decomposition into prims; one with
neither runs through ``torch.func.vmap`` on its own (the symbol ``torch_func_vmap``, which
``explain`` lists beside the others): correct for every torch operation, without fusion across it.
"""

from __future__ import annotations

import functools

import torch

from thunder_core.autodiff.fallback import fallback_backward, fallback_forward
from thunder_core.batching_autograd import PendingBackward, batched_backward
from thunder_core.batching_prims import PRIM_RULES
from thunder_core.capture.meta import run_on_meta
from thunder_core.capture.torch_vmap import original_vmap
from thunder_core.errors import ThunderCoreError
from thunder_core.ir.proxies import PROXY_TYPES, TensorProxy
from thunder_core.ir.symbols import INPLACE, OPAQUE, RANDOM, Symbol, active_recorder
from thunder_core.ir.tree import leaves, tree_map

RANDOMNESS = ("error", "different", "same")


def _vmapped_impl(name, fn, in_dims, randomness, args, kwargs):
    def call(*mapped):
        return fn(*mapped, **kwargs)

    return original_vmap()(call, in_dims=in_dims, randomness=randomness)(*args)


def _vmapped_meta(name, fn, in_dims, randomness, args, kwargs):
    # ``fn`` on one example's stand-ins, the batch prepended to its outputs: ``torch.func.vmap``
    # is not run on meta tensors (an op failing there can leave functorch's state broken).
    recorder = active_recorder()
    sizes = []

    def example(x, dim):
        if isinstance(dim, dict):
            return {key: example(value, dim[key]) for key, value in x.items()}
        if isinstance(dim, (tuple, list)):
            return type(x)(example(item, d) for item, d in zip(x, dim))
        if isinstance(x, TensorProxy) and dim is not None:
            sizes.append(x.shape[dim])
            shape = [s for i, s in enumerate(x.shape) if i != dim % x.ndim]
            return TensorProxy(recorder.namer(), shape, x.dtype, x.device, x.requires_grad)
        return x

    examples = tuple(example(a, d) for a, d in zip(args, in_dims))
    out = run_on_meta(fn, examples, kwargs, recorder.new_proxy, inplace=False)
    return tree_map(
        lambda y: (
            recorder.new_proxy((sizes[0], *y.shape), y.dtype, y.device, y.requires_grad, None)
            if isinstance(y, TensorProxy)
            else y
        ),
        out,
    )


#: One operation without a batching rule (named by its first argument, as the trace prints it),
#: mapped by ``torch.func.vmap`` at run time.
torch_func_vmap = Symbol(
    name="torch_func_vmap", impl=_vmapped_impl, printed_name="torch_func_vmap", meta=_vmapped_meta
)

_ELEMENTWISE = frozenset(
    """add sub mul div true_divide neg exp exp2 log log2 log1p expm1 tanh sigmoid relu gelu silu sin cos
    sqrt rsqrt pow maximum minimum where abs square reciprocal clamp erf sign eq ne lt le gt ge
    logical_not logical_and logical_or bitwise_and bitwise_or ones_like zeros_like full_like float
    half bfloat16 double detach contiguous clone aten.tanh_backward aten.sigmoid_backward
    aten.threshold_backward aten.gelu_backward aten.silu_backward""".split()
)
_REDUCTIONS = frozenset(
    "sum mean amax amin softmax log_softmax logsumexp cumsum var std argmax argmin".split()
)
_FULL_WHEN_NO_DIM = frozenset("sum mean".split())


def _call(name: str, *args, **kwargs):
    from thunder_core.ops.registry import TORCH_SYMBOLS

    return TORCH_SYMBOLS[name](*args, **kwargs)


class Batcher:
    """Replays recorded operations on batched values (batch in dimension 0, ``size`` examples)."""

    def __init__(self, size: int, randomness: str):
        self.size = size
        self.randomness = randomness
        self.values: dict[int, object] = {}  # id of a recorded value -> its replayed value
        self.batched: set[int] = set()  # ids of replayed values that carry the batch
        self.not_batched: set[int] = set()  # outputs a rule made the same for every example

    def bind(self, recorded, value, batched: bool) -> None:
        self.values[id(recorded)] = value
        if batched:
            self.batched.add(id(value))

    def value(self, recorded):
        return self.values.get(id(recorded), recorded) if isinstance(recorded, PROXY_TYPES) else recorded

    def is_batched(self, value) -> bool:
        return isinstance(value, TensorProxy) and id(value) in self.batched

    def replay(self, bound_symbols) -> None:
        for bsym in bound_symbols:
            if bsym.symbol is fallback_forward or bsym.symbol is fallback_backward:
                self._autograd_fallback(bsym)
                continue
            args, kwargs = tree_map(self.value, bsym.args), tree_map(self.value, bsym.kwargs)
            if not any(self.is_batched(x) for x in leaves((args, kwargs))):
                if bsym.symbol.has_tag(RANDOM) and self.randomness == "error":
                    raise ThunderCoreError(
                        f"thunder_core.vmap: {bsym.symbol.printed_name} draws random numbers; pass "
                        "randomness='different' (each example its own) or 'same' (one draw for all), as torch.func.vmap"
                    )
                if bsym.symbol.has_tag(RANDOM) and self.randomness == "different":
                    raise ThunderCoreError(
                        f"thunder_core.vmap: {bsym.symbol.printed_name} draws random numbers from no batched "
                        "input; randomness='different' is supported where a random op takes a batched tensor"
                    )
                out = bsym.symbol(*args, **kwargs)
                self._bind_outputs(bsym.output, out, batched=False)
                continue
            if bsym.symbol.has_tag(INPLACE):
                raise ThunderCoreError(
                    f"thunder_core.vmap: {bsym.symbol.printed_name} updates a tensor in place where a mapped "
                    "value is involved, which vmap does not support yet; use the out-of-place operation"
                )
            rule = None if bsym.symbol.has_tag(RANDOM) else _rule(bsym.symbol)
            out = rule(bsym.symbol, self, args, kwargs) if rule is not None else None
            if out is None and _replayable_decomposition(bsym):
                self.replay(bsym.subsymbols)  # capture renamed its results to the op's outputs
                continue
            if out is None:
                out = self._fallback(bsym.symbol.printed_name, bsym.symbol.impl, args, kwargs)
            self._bind_outputs(bsym.output, out, batched=True)

    def _bind_outputs(self, recorded, out, batched: bool) -> None:
        for old, new in zip(leaves(recorded), leaves(out)):
            if isinstance(old, PROXY_TYPES):
                self.bind(
                    old, new, batched and isinstance(new, TensorProxy) and id(new) not in self.not_batched
                )

    def _autograd_fallback(self, bsym) -> None:
        """An op a gradient differentiates with PyTorch autograd: its forward batched like any op
        without a rule, its backward as ``torch.func.vjp`` of the op, mapped
        (``batching_autograd``); unbatched, both as recorded."""
        if bsym.symbol is fallback_forward:
            fn, args, kwargs, differentiable = tree_map(self.value, bsym.args)
            out_recorded, handle_recorded = bsym.output
            handle = None
            if any(self.is_batched(x) for x in leaves((args, kwargs))):
                out = self._fallback(getattr(fn, "__name__", "op"), fn, args, kwargs)
                self._bind_outputs(out_recorded, out, batched=True)
            else:
                out, handle = fallback_forward(fn, args, kwargs, differentiable)
                self._bind_outputs(out_recorded, out, batched=False)
            self.values[id(handle_recorded)] = PendingBackward(fn, args, kwargs, differentiable, handle)
            return
        pending = self.values.get(id(bsym.args[0]))
        if not isinstance(pending, PendingBackward):
            raise ThunderCoreError(
                "thunder_core.vmap: the backward of an op differentiated by PyTorch autograd is mapped "
                "without its forward; map the whole gradient computation (vmap(grad(f)))"
            )
        grads = tree_map(self.value, bsym.args[2])
        out = batched_backward(self, pending, grads)
        if out is not None:
            self._bind_outputs(bsym.output, out, batched=True)
            return
        out = fallback_backward(pending.handle, tree_map(self.value, bsym.args[1]), grads)
        self._bind_outputs(bsym.output, out, batched=False)

    def _fallback(self, name: str, impl, args, kwargs):
        if any(self.is_batched(x) for x in leaves(kwargs)):
            moved = dict(kwargs)
            # a batched keyword argument: pass it positionally to a wrapper that names it
            names = [k for k, v in kwargs.items() if any(self.is_batched(x) for x in leaves(v))]
            values = [moved.pop(k) for k in names]
            fn = _KeywordCall(impl, len(args), tuple(names))
            args = (*args, *values)
            kwargs = moved
        else:
            fn = impl
        in_dims = tuple(0 if self.is_batched(x) else None for x in args)
        if any(not isinstance(x, TensorProxy) and any(self.is_batched(y) for y in leaves(x)) for x in args):
            in_dims = tuple(tree_map(lambda y: 0 if self.is_batched(y) else None, x) for x in args)
        # torch.func.vmap's own flag applies to random draws inside any op (dropout in attention)
        return torch_func_vmap(name, fn, in_dims, self.randomness, tuple(args), dict(kwargs))

    def per_example_rank(self, x) -> int:
        return x.ndim - 1 if self.is_batched(x) else x.ndim


class _KeywordCall:
    """``impl(*args[:n], **dict(zip(names, args[n:])))``: keyword tensors mapped positionally."""

    def __init__(self, impl, positional: int, names: tuple):
        self.impl, self.positional, self.names = impl, positional, names

    def __call__(self, *args, **kwargs):
        given = dict(zip(self.names, args[self.positional :]))
        return self.impl(*args[: self.positional], **given, **kwargs)

    def __repr__(self) -> str:
        return f"keywords({getattr(self.impl, '__name__', self.impl)}, {self.names})"


def _rule(symbol: Symbol):
    rule = _RULES.get(_key(symbol))
    if rule is None and not symbol.is_prim and _pointwise(symbol.name):
        return _elementwise
    if rule is None and symbol.name in _MATRIX_OPS:
        return _matrices_with_leading_batch
    return rule


@functools.cache
def _pointwise(name: str) -> bool:
    """A torch-level op that PyTorch tags pointwise (elementwise with broadcasting, no random
    draws) in ATen under the same name (``nn.functional.elu`` -> ``aten.elu``)."""
    short = name.rsplit(".", 1)[-1]
    try:
        packet = getattr(torch.ops.aten, f"special_{short}" if name.startswith("special.") else short)
        overloads = packet.overloads()
        op = getattr(packet, "default" if "default" in overloads else overloads[0])
    except Exception:  # noqa: BLE001 - no ATen op of that name
        return False
    return torch.Tag.pointwise in op.tags and torch.Tag.nondeterministic_seeded not in op.tags


def _replayable_decomposition(bsym) -> bool:
    """An operation whose recorded decomposition can be batched instead: one that draws no random
    numbers anywhere inside (torch.func.vmap applies the randomness asked for to the whole op)."""
    if not bsym.subsymbols or bsym.symbol.has_tag(OPAQUE):
        return False

    def draws(bsyms) -> bool:
        return any(b.symbol.has_tag(RANDOM) or draws(b.subsymbols) for b in bsyms)

    return not draws(bsym.subsymbols)


def _key(symbol: Symbol) -> str:
    return f"prims.{symbol.name}" if symbol.is_prim else symbol.name


def _aligned(batcher: Batcher, x, rank: int):
    """A batched ``x`` with singleton dimensions after the batch up to ``rank`` example dims."""
    if not batcher.is_batched(x):
        return x
    missing = rank - (x.ndim - 1)
    if missing <= 0:
        return x
    aligned = _call("reshape", x, (x.shape[0], *([1] * missing), *x.shape[1:]))
    batcher.batched.add(id(aligned))
    return aligned


def _elementwise(symbol, batcher, args, kwargs):
    tensors = [x for x in leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    if len({x.dtype for x in tensors}) > 1 and any(batcher.is_batched(x) and x.ndim == 1 for x in tensors):
        # A 0-d example would take part in type promotion as a tensor with dims once batched
        # (float64 0-d with float32 gives float32 per example, float64 batched): torch.func's
        return None
    rank = max(batcher.per_example_rank(x) for x in tensors)
    args = tree_map(lambda x: _aligned(batcher, x, rank) if isinstance(x, TensorProxy) else x, args)
    kwargs = tree_map(lambda x: _aligned(batcher, x, rank) if isinstance(x, TensorProxy) else x, kwargs)
    return symbol(*args, **kwargs)


def _shaped_like_first(symbol, batcher, args, kwargs):
    """``to(other)``, ``type_as(other)``: the first argument's values and shape, so the output is
    batched exactly when the first argument is."""
    out = symbol(*args, **kwargs)
    if not batcher.is_batched(args[0]) and isinstance(out, TensorProxy):
        batcher.not_batched.add(id(out))
    return out


def _masked_fill(symbol, batcher, args, kwargs):
    if kwargs or len(args) != 3 or batcher.is_batched(args[2]):  # a batched fill value: torch.func's
        return None
    return _elementwise(symbol, batcher, args, kwargs)


def _only_first_batched(batcher, args, kwargs) -> bool:
    return batcher.is_batched(args[0]) and not any(batcher.is_batched(x) for x in leaves((args[1:], kwargs)))


def _shift(dim):
    if isinstance(dim, int):
        return dim + 1 if dim >= 0 else dim
    return tuple(_shift(d) for d in dim)


def _with_dim(symbol, batcher, args, kwargs):
    """Ops whose ``dim`` (second positional or keyword) counts the example's dimensions."""
    if not args or not _only_first_batched(batcher, args, kwargs):
        return None
    x = args[0]
    if x.ndim == 1:  # one number per example: dims 0 and -1 both name it
        return None
    if "axis" in kwargs:  # numpy's name for dim: left to torch.func
        return None
    if len(args) > 1:
        dim, rest, keyword = args[1], args[2:], False
    else:
        dim, rest, keyword = kwargs.get("dim"), (), "dim" in kwargs
    if isinstance(dim, bool):  # var(x, True): ``unbiased``, not a dim
        return None
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        if symbol.name not in _FULL_WHEN_NO_DIM:
            return None
        dim = tuple(range(1, x.ndim))
    elif isinstance(dim, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in dim):
        dim = _shift(tuple(dim))
    elif isinstance(dim, int):
        dim = _shift(dim)
    else:
        return None
    if keyword or len(args) == 1:
        return symbol(x, *rest, **{**kwargs, "dim": dim})
    return symbol(x, dim, *rest, **kwargs)


def _reshape(symbol, batcher, args, kwargs):
    if kwargs or not _only_first_batched(batcher, args, kwargs):
        return None
    x, shape = args[0], args[1:]
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    if not all(isinstance(size, (int, torch.SymInt)) for size in shape):  # view(dtype): not a shape
        return None
    return symbol(x, (x.shape[0], *shape))


def _unsqueeze(symbol, batcher, args, kwargs):
    if kwargs or len(args) != 2 or not _only_first_batched(batcher, args, kwargs):
        return None
    return symbol(args[0], _shift(args[1]))


def _transpose(symbol, batcher, args, kwargs):
    if kwargs or len(args) != 3 or not _only_first_batched(batcher, args, kwargs) or args[0].ndim == 1:
        return None
    return symbol(args[0], _shift(args[1]), _shift(args[2]))


def _permute(symbol, batcher, args, kwargs):
    if kwargs or not _only_first_batched(batcher, args, kwargs):
        return None
    x, dims = args[0], args[1:]
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    rank = x.ndim - 1
    return symbol(x, (0, *(d % rank + 1 for d in dims)) if rank else (0,))


def _t(symbol, batcher, args, kwargs):
    if kwargs or len(args) != 1 or not _only_first_batched(batcher, args, kwargs):
        return None
    x = args[0]
    return _call("transpose", x, 1, 2) if x.ndim == 3 else x


def _expand(symbol, batcher, args, kwargs):
    if kwargs or not _only_first_batched(batcher, args, kwargs):
        return None
    x, shape = args[0], args[1:]
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    x = _aligned(batcher, x, len(shape))
    return symbol(x, (x.shape[0], *shape))


def _linear(symbol, batcher, args, kwargs):
    if _only_first_batched(batcher, args, kwargs) and args[0].ndim >= 2:
        return symbol(*args, **kwargs)  # (B, ..., in): the batch is one more leading dim
    x, weight = args[0], args[1] if len(args) > 1 else kwargs.get("weight")
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if not batcher.is_batched(weight) or weight.ndim != 3:
        return None
    # A weight per example (an ensemble): x @ W^T (+ b) as a batched matrix product.
    rank = batcher.per_example_rank(x)
    transposed = _call("transpose", weight, -1, -2)  # (B, in, out)
    batcher.batched.add(id(transposed))
    if batcher.is_batched(x):
        single = rank == 1
        x = _call("reshape", x, (x.shape[0], 1, x.shape[1])) if single else x
        batcher.batched.add(id(x))
        out = _call("matmul", _aligned(batcher, x, max(rank, 2)), _aligned(batcher, transposed, max(rank, 2)))
        if single:
            out = _call("reshape", out, (out.shape[0], out.shape[-1]))
    else:
        out = _call("matmul", x, _aligned(batcher, transposed, max(rank, 2)))
    batcher.batched.add(id(out))
    if bias is not None:
        out_rank = out.ndim - 1
        out = _call("add", out, _aligned(batcher, bias, out_rank))
    return out


def _dim_of_aligned(position: int):
    """Ops of several same-rank tensors with a ``dim`` at ``position`` (softmax backwards)."""

    def rule(symbol, batcher, args, kwargs):
        tensors = [x for x in args if isinstance(x, TensorProxy)]
        if kwargs or len(args) <= position or not all(batcher.is_batched(x) for x in tensors):
            return None
        if len({x.ndim for x in tensors}) != 1 or not isinstance(args[position], int):
            return None
        return symbol(*args[:position], _shift(args[position]), *args[position + 1 :])

    return rule


def _examples_merged_into_dim_0(symbol, batcher, args, kwargs):
    """Ops that compute each index of their inputs' dimension 0 on its own (attention and its
    backward over (N, heads, L, E)): the batch is merged into that dimension and split off again.
    Unbatched tensors (a mask) must broadcast over it: two dimensions at most."""
    tensors = [x for x in leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    batched = [x for x in tensors if batcher.is_batched(x)]
    if any(not batcher.is_batched(x) and x.ndim > 2 for x in tensors):
        return None
    # Examples of (N, heads, L, E): with (L, E) examples, dim 1 is L, which attention mixes.
    if any(x.ndim < 4 for x in batched) or len({x.shape[1] for x in batched}) != 1:
        return None
    position, name = _DROPOUT[symbol.name]
    dropout = args[position] if len(args) > position else kwargs.get(name, 0.0)
    if dropout:  # random draws: torch.func.vmap, with the randomness asked for
        return None
    size, inner = batcher.size, batched[0].shape[1]

    def merge(x):
        if isinstance(x, TensorProxy) and batcher.is_batched(x):
            return _call("reshape", x, (size * inner, *x.shape[2:]))
        return x

    out = symbol(*tree_map(merge, args), **tree_map(merge, kwargs))

    def split(y):
        if isinstance(y, TensorProxy) and y.ndim >= 1 and y.shape[0] == size * inner:
            return _call("reshape", y, (size, inner, *y.shape[1:]))
        if isinstance(y, TensorProxy):
            batcher.not_batched.add(id(y))  # a random seed, an offset: one for the whole call
        return y

    return tree_map(split, out)


def _no_tensor_in(index) -> bool:
    """A basic index only: ints, slices, None and Ellipsis (a list or tensor index is advanced
    indexing, whose dims move in front of a leading ``:`` when separated by a slice)."""
    items = index if type(index) is tuple else (index,)
    return all(
        x is None or x is Ellipsis or isinstance(x, slice) or (isinstance(x, int) and not isinstance(x, bool))
        for x in items
    )


def _past_batch(index) -> tuple:
    """A basic index (ints, slices, None, Ellipsis) of one example, for the batch."""
    index = index if type(index) is tuple else (index,)
    return index if index[:1] == (Ellipsis,) else (slice(None), *index)


def _getitem(symbol, batcher, args, kwargs):
    if (
        kwargs
        or len(args) != 2
        or not _only_first_batched(batcher, args, kwargs)
        or not _no_tensor_in(args[1])
    ):
        return None
    if any(isinstance(i, bool) for i in leaves(args[1])):
        return None
    return symbol(args[0], _past_batch(args[1]))


def _basic_index_backward(symbol, batcher, args, kwargs):
    if (
        kwargs
        or len(args) != 3
        or not _only_first_batched(batcher, args, kwargs)
        or not _no_tensor_in(args[2])
    ):
        return None
    grad, shape, index = args
    return symbol(grad, (batcher.size, *shape), _past_batch(index))


def _split(symbol, batcher, args, kwargs):
    if not _only_first_batched(batcher, args, kwargs) or len(args) < 2:
        return None
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    if not isinstance(dim, int) or args[0].ndim == 1:
        return None
    return symbol(args[0], args[1], _shift(dim))


def _cat(symbol, batcher, args, kwargs):
    tensors = list(args[0]) if args and isinstance(args[0], (list, tuple)) else None
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if tensors is None or not isinstance(dim, int) or set(kwargs) - {"dim"}:
        return None
    every = []
    for x in tensors:
        if not batcher.is_batched(x):  # the same for every example: repeated along the batch
            x = _call("expand", _call("unsqueeze", x, 0), (batcher.size, *x.shape))
        every.append(x)
    return symbol(every, _shift(dim))


#: Ops of one (square or not) matrix that take any leading batch dimensions and no dims.
_MATRIX_OPS = frozenset(
    """linalg.inv linalg.inv_ex linalg.det linalg.slogdet linalg.cholesky linalg.cholesky_ex linalg.eig
    linalg.eigvals linalg.eigh linalg.eigvalsh linalg.qr linalg.svd linalg.svdvals linalg.lu linalg.lu_factor
    linalg.lu_factor_ex linalg.matrix_exp linalg.pinv linalg.matrix_power linalg.matrix_rank det logdet slogdet
    inverse pinverse matrix_exp cholesky qr svd""".split()
)


def _matrices_with_leading_batch(symbol, batcher, args, kwargs):
    """Matrix ops (inverse, decompositions, determinants) over (..., m, n): the batch is one more
    leading dimension, given one batched matrix and no other tensor."""
    tensors = [x for x in leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    if len(tensors) != 1 or not batcher.is_batched(tensors[0]) or tensors[0].ndim < 3:
        return None
    return symbol(*args, **kwargs)


#: Where each attention op takes its dropout probability: (position, keyword).
_DROPOUT = {
    "scaled_dot_product_attention": (4, "dropout_p"),
    "aten._scaled_dot_product_flash_attention_for_cpu": (3, "dropout_p"),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": (6, "dropout_p"),
    "aten._scaled_dot_product_efficient_attention": (5, "dropout_p"),
    "aten._scaled_dot_product_efficient_attention_backward": (9, "dropout_p"),
    "aten._scaled_dot_product_flash_attention": (3, "dropout_p"),
    "aten._scaled_dot_product_flash_attention_backward": (10, "dropout_p"),
}
_ATTENTION = tuple(_DROPOUT)
_RULES = dict(PRIM_RULES)
_RULES.update({name: _elementwise for name in _ELEMENTWISE})
_RULES.update({name: _examples_merged_into_dim_0 for name in _ATTENTION})
_RULES.update(
    {"getitem": _getitem, "basic_index_backward": _basic_index_backward, "split": _split, "cat": _cat}
)
_RULES.update({"to": _shaped_like_first, "type_as": _shaped_like_first, "masked_fill": _masked_fill})
_RULES.update({"aten._log_softmax": _with_dim, "aten._softmax": _with_dim})
_RULES.update(
    {name: _dim_of_aligned(2) for name in ("aten._log_softmax_backward_data", "aten._softmax_backward_data")}
)
_RULES.update({name: _with_dim for name in _REDUCTIONS})
_RULES.update(
    {
        "reshape": _reshape,
        "view": _reshape,
        "unsqueeze": _unsqueeze,
        "transpose": _transpose,
        "swapaxes": _transpose,
        "permute": _permute,
        "t": _t,
        "expand": _expand,
        "linear": _linear,
        "matmul": PRIM_RULES["prims.matmul"],  # the same meaning: torch.matmul
    }
)
