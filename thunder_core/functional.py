"""Functional transforms with torch.func's signatures, as trace transforms: ``grad``,
``grad_and_value`` (and ``value_and_grad``, the same in JAX's order) and ``vjp``.

Called while ``thunder_core.jit`` captures a function (``jit(grad(f))``, or ``grad(f)`` inside a
jitted function or module), a transform records ``f`` on stand-ins of the differentiated
arguments, splits that record into a forward and a backward with the VJP rules autodiff uses,
and replays both into the program being captured: the result is one trace, which the executors
fuse like any other. Nested transforms (``grad(grad(f))``) differentiate the replayed backward
of the inner one. Called outside a capture, ``grad(f)`` and ``value_and_grad(f)`` compile
themselves with ``thunder_core.jit`` on first use (one cached program per input signature);
``vjp(f, *primals)`` returns the output and a ``vjp_fn`` compiled the same way, which computes
the forward again with the backward (inside a capture, both are one trace and nothing is
recomputed).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from thunder_core.capture.recorder import Recorder
from thunder_core.capture.torch_vmap import record_vmap_with
from thunder_core.errors import ThunderCoreError
from thunder_core.ir.proxies import PROXY_TYPES, TensorProxy
from thunder_core.ir.symbols import active_recorder, pop_recorder, push_recorder
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves, tree_map

#: What a transform compiles when called outside a capture: per transformed function (a bound
#: method's function), {(transform and its options, the method's object): compiled}. So
#: ``thunder_core.grad(f)(x)`` written inline in a loop compiles once, as ``torch.func`` users write it.
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COMPILED_STRONG: dict = {}  # for callables that cannot be weakly referenced


def _cached(fn: Callable, key: tuple, make: Callable):
    owner = getattr(fn, "__func__", fn)
    key = (*key, id(getattr(fn, "__self__", None)))  # the compiled function keeps that object alive
    try:
        table = _COMPILED.setdefault(owner, {})
    except TypeError:
        table = _COMPILED_STRONG.setdefault(owner, {})
    if key not in table:
        table[key] = make()
    return table[key]


def _jitted(inside: Callable):
    from thunder_core.jit.function import ThunderFunction

    return ThunderFunction.from_arguments(inside, {})


class _Differentiated:
    """``fn`` recorded on stand-ins of the differentiated tensors, split into forward and
    backward, with the forward replayed into the capture in progress."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, positions: list[int], has_aux: bool):
        from thunder_core.autodiff.helpers import ops  # autodiff is imported when first used
        from thunder_core.autodiff.joint import split_forward_backward

        recorder = active_recorder()
        flat, spec = pytree.tree_flatten(args)
        self.primals = flat
        self.wanted = positions  # flat positions whose gradients are asked for
        stand_ins = list(flat)
        self.inputs = []
        for i in positions:
            leaf = flat[i]
            if not isinstance(leaf, TensorProxy):
                raise ThunderCoreError(
                    f"thunder_core: a differentiated argument must be a tensor, got {type(leaf).__name__}"
                )
            if not (leaf.dtype.is_floating_point or leaf.dtype.is_complex):
                raise ThunderCoreError(
                    f"thunder_core: only floating-point and complex tensors have gradients; a differentiated "
                    f"argument is {leaf.dtype}"
                )
            stand_ins[i] = TensorProxy(
                recorder.namer(),
                leaf.shape,
                leaf.dtype,
                leaf.device,
                requires_grad=True,
                strides=leaf.stride(),
            )
            self.inputs.append(stand_ins[i])
        inner = Recorder(
            recorder.namer, top_level=recorder.top_level, grad_on_at_call=recorder.grad_on_at_call
        )
        push_recorder(inner)
        try:
            with torch.enable_grad():  # a transform differentiates under any outer grad mode, as torch.func's
                result = fn(*pytree.tree_unflatten(stand_ins, spec), **kwargs)
            if has_aux:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise ThunderCoreError(
                        "thunder_core: with has_aux=True the function must return (output, aux), got "
                        f"{type(result).__name__}"
                    )
                output, aux = result
                with torch._C.DisableTorchFunction():  # thunder_core's own symbol call, not the user's
                    aux = tree_map(lambda x: ops.detach(x) if isinstance(x, TensorProxy) else x, aux)
            else:
                output, aux = result, None
        finally:
            pop_recorder()
        trace = Trace(inputs=self.inputs, bound_symbols=inner.bound_symbols, output=(output, aux))
        # thunder_core's own work from here: the capture's torch-function mode must not see the
        # torch calls that compute metadata (they are not the user's program).
        with torch._C.DisableTorchFunction(), torch.enable_grad():
            split = split_forward_backward(trace)
            self.split = split
            self._renamed: dict[int, Any] = {id(s): flat[i] for s, i in zip(self.inputs, positions)}
            self._replay(split.forward.bound_symbols)
        flat_outputs, self.saved = split.forward.output
        self.flat_outputs = [self._rename(x) for x in flat_outputs]
        output_structure = split.output_structure
        values = tree_map(lambda i: self.flat_outputs[i], output_structure)
        self.output, self.aux = values
        self.differentiable = split.output_differentiable

    def _rename(self, x):
        return self._renamed.get(id(x), x) if isinstance(x, PROXY_TYPES) else x

    def _replay(self, bound_symbols) -> None:
        for bsym in bound_symbols:
            out = bsym.symbol(*tree_map(self._rename, bsym.args), **tree_map(self._rename, bsym.kwargs))
            for old, new in zip(leaves(bsym.output), leaves(out)):
                if isinstance(old, PROXY_TYPES) and old is not new:
                    self._renamed[id(old)] = new

    def gradients(self, cotangents: list) -> list:
        """The gradients of the wanted primals (zeros where nothing flows) for one cotangent per
        flat leaf of the output (None: zero)."""
        from thunder_core.autodiff.helpers import like, ops

        backward = self.split.backward
        grad_inputs = backward.inputs[len(self.saved) :]
        pairs = [  # the backward takes one cotangent per differentiable output (aux is detached)
            (ct, out) for ct, out, diff in zip(cotangents, self.flat_outputs, self.differentiable) if diff
        ]
        if len(pairs) != len(grad_inputs):
            raise ThunderCoreError("thunder_core: one cotangent per output is needed")  # a bug, never silent
        with torch._C.DisableTorchFunction(), torch.enable_grad():
            for proxy, (ct, out) in zip(grad_inputs, pairs):
                self._renamed[id(proxy)] = ops.zeros_like(out) if ct is None else ct
            self._replay(backward.bound_symbols)
            grads = [self._rename(g) for g in backward.output]
            # As autograd leaves them: zeros where nothing flows, each in its primal's dtype.
            return [
                ops.zeros_like(self.primals[i]) if g is None else like(g, self.primals[i])
                for g, i in zip(grads, self.wanted)
            ]


def _positions(args: tuple, argnums) -> tuple[list[int], Callable]:
    """The flat leaf positions of ``args[argnums]`` and how to rebuild the gradients' structure."""
    single = isinstance(argnums, int)
    numbers = (argnums,) if single else tuple(argnums)
    if not numbers:
        raise ThunderCoreError("thunder_core.grad: argnums must name at least one argument")
    for n in numbers:
        if not isinstance(n, int) or not -len(args) <= n < len(args):
            raise ThunderCoreError(
                f"thunder_core.grad: argnums {argnums!r} names no argument of a call with {len(args)} arguments"
            )
    numbers = tuple(n % len(args) for n in numbers)
    positions, specs, offset = [], [], 0
    for n, arg in enumerate(args):
        flat, spec = pytree.tree_flatten(arg)
        if n in numbers:
            positions.append(list(range(offset, offset + len(flat))))
            specs.append((n, spec))
        offset += len(flat)
    order = {n: k for k, (n, _) in enumerate(specs)}

    def rebuild(grads: list):
        parts, start = [], 0
        for (_, spec), flat_positions in zip(specs, positions):
            parts.append(pytree.tree_unflatten(grads[start : start + len(flat_positions)], spec))
            start += len(flat_positions)
        if single:
            return parts[0]
        return tuple(parts[order[n]] for n in numbers)

    return [p for group in positions for p in group], rebuild


def _scalar(output) -> None:
    if not isinstance(output, torch.Tensor) or output.numel() != 1:
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise ThunderCoreError(
            f"thunder_core.grad: the function must return a tensor with one element, got {shape}; "
            "use thunder_core.vjp for other outputs"
        )


def _compiled_outside_capture(fn: Callable, key: tuple, inside: Callable) -> Callable:
    """A function like ``fn`` that runs ``inside`` while a capture is in progress, else a jit of it
    (one per ``fn`` and ``key``)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if active_recorder() is not None:
            return inside(*args, **kwargs)
        return _cached(fn, key, lambda: _jitted(inside))(*args, **kwargs)

    return call


def _argnums_key(argnums) -> object:
    return argnums if isinstance(argnums, int) else tuple(argnums)


def value_and_grad(fn: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """``grad_and_value`` in the order JAX and the issue tracker's users expect: a function returning
    ``(fn(*args), gradient)`` (or
    ``((output, aux), gradient)`` with ``has_aux``), the gradient of the one-element output with
    respect to ``args[argnums]`` (a tuple of them for a tuple ``argnums``; pytrees as given)."""

    def inside(*args, **kwargs):
        positions, rebuild = _positions(args, argnums)
        done = _Differentiated(fn, args, kwargs, positions, has_aux)
        _scalar(done.output)
        from thunder_core.autodiff.helpers import ops

        with torch._C.DisableTorchFunction():
            cotangents = [ops.ones_like(done.output)]
        gradient = rebuild(done.gradients(cotangents))
        value = (done.output, done.aux) if has_aux else done.output
        return value, gradient

    return _compiled_outside_capture(fn, ("value_and_grad", _argnums_key(argnums), has_aux), inside)


def grad_and_value(fn: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """``torch.func.grad_and_value``: ``(gradient, fn(*args))`` (``(gradient, (output, aux))``
    with ``has_aux``)."""
    both = value_and_grad(fn, argnums, has_aux)

    def inside(*args, **kwargs):
        value, gradient = both(*args, **kwargs)
        return gradient, value

    return _compiled_outside_capture(fn, ("grad_and_value", _argnums_key(argnums), has_aux), inside)


def grad(fn: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """``torch.func.grad``: a function returning the gradient of ``fn``'s one-element output with
    respect to ``args[argnums]`` (and ``aux`` with ``has_aux``: ``(gradient, aux)``)."""
    both = value_and_grad(fn, argnums, has_aux)

    def inside(*args, **kwargs):
        value, gradient = both(*args, **kwargs)
        return (gradient, value[1]) if has_aux else gradient

    return _compiled_outside_capture(fn, ("grad", _argnums_key(argnums), has_aux), inside)


def vjp(fn: Callable, *primals, has_aux: bool = False):
    """``torch.func.vjp``: ``(fn(*primals), vjp_fn)`` (``(output, vjp_fn, aux)`` with
    ``has_aux``); ``vjp_fn(cotangents)`` (shaped like the output) returns one gradient per primal,
    shaped like it."""
    if active_recorder() is None:
        return _vjp_outside_capture(fn, primals, has_aux)
    done = _Differentiated(fn, primals, {}, list(range(len(pytree.tree_leaves(primals)))), has_aux)
    spec = pytree.tree_structure(primals)
    output_spec = pytree.tree_structure(done.output)

    def vjp_fn(cotangents):
        flat, given_spec = pytree.tree_flatten(cotangents)
        if given_spec != output_spec:
            raise ThunderCoreError(
                f"thunder_core.vjp: the cotangents must be shaped like the output ({output_spec}), got {given_spec}"
            )
        return pytree.tree_unflatten(done.gradients(flat), spec)

    return (done.output, vjp_fn, done.aux) if has_aux else (done.output, vjp_fn)


def jvp(fn: Callable, primals: tuple, tangents: tuple, *, has_aux: bool = False):
    """``torch.func.jvp``: ``(fn(*primals), J @ tangents)`` (``(output, jvp_out, aux)`` with
    ``has_aux``), shaped like the output.

    Forward mode: ``fn`` is recorded once and replayed with the tangents pushed forward by each
    operation's forward-mode rule (see ``thunder_core.forward_mode``; ``torch.func.jvp`` for an
    operation without one). Where that cannot be traced, the transpose of the VJP is used: the
    VJP ``u -> J^T u`` is linear in ``u``, so its own VJP at the tangents is ``J @ tangents``.
    """
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise ThunderCoreError(
            "thunder_core.jvp: primals and tangents must be tuples, as torch.func.jvp takes them"
        )
    if active_recorder() is None:
        compiled = _cached(fn, ("jvp", has_aux), lambda: _jitted(lambda p, t: jvp(fn, p, t, has_aux=has_aux)))
        return compiled(primals, tangents)
    if pytree.tree_structure(primals) != pytree.tree_structure(tangents):
        raise ThunderCoreError("thunder_core.jvp: the tangents must be shaped like the primals")
    pushed = _pushed_forward(fn, primals, tangents, has_aux)
    if pushed is None:
        return _jvp_by_transposing(fn, primals, tangents, has_aux)
    output, jvp_out, aux = pushed
    return (output, jvp_out, aux) if has_aux else (output, jvp_out)


def _pushed_forward(fn: Callable, primals: tuple, tangents: tuple, has_aux: bool):
    """Forward mode, recorded aside and copied into the capture only when it all traced (so an
    operation that cannot be is never recorded twice); None when it could not be traced."""
    from thunder_core.forward_mode import pushforward

    recorder = active_recorder()
    scratch = Recorder(recorder.namer, top_level=recorder.top_level, grad_on_at_call=recorder.grad_on_at_call)
    push_recorder(scratch)
    try:
        outputs, output_tangents, aux, spec = pushforward(fn, primals, tangents, has_aux)
    except ThunderCoreError:
        raise
    except Exception:  # noqa: BLE001 - e.g. an operation PyTorch has no forward-mode formula for
        return None
    finally:
        pop_recorder()
    renamed: dict[int, Any] = {}

    def rename(x):
        return renamed.get(id(x), x) if isinstance(x, PROXY_TYPES) else x

    with torch._C.DisableTorchFunction():  # thunder_core's own symbol calls, not the user's
        for bsym in scratch.bound_symbols:
            out = bsym.symbol(*tree_map(rename, bsym.args), **tree_map(rename, bsym.kwargs))
            for old, new in zip(leaves(bsym.output), leaves(out)):
                if isinstance(old, PROXY_TYPES) and old is not new:
                    renamed[id(old)] = new
    outputs, output_tangents = [rename(x) for x in outputs], [rename(x) for x in output_tangents]
    aux = tree_map(rename, aux)
    return pytree.tree_unflatten(outputs, spec), pytree.tree_unflatten(output_tangents, spec), aux


def _jvp_by_transposing(fn: Callable, primals: tuple, tangents: tuple, has_aux: bool):
    done = _Differentiated(fn, primals, {}, list(range(len(pytree.tree_leaves(primals)))), has_aux)
    flat_output, output_spec = pytree.tree_flatten(done.output)
    from thunder_core.autodiff.helpers import ops

    with torch._C.DisableTorchFunction():
        zeros = tuple(ops.zeros_like(x) for x in flat_output)  # where the (linear) pullback is taken

    def pullback(*cotangents):
        return tuple(done.gradients(list(cotangents)))

    transposed = _Differentiated(pullback, zeros, {}, list(range(len(zeros))), False)
    flat_tangents = pytree.tree_leaves(tangents)
    jvp_out = pytree.tree_unflatten(transposed.gradients(flat_tangents), output_spec)
    return (done.output, jvp_out, done.aux) if has_aux else (done.output, jvp_out)


def _vjp_outside_capture(fn: Callable, primals: tuple, has_aux: bool):
    def forward(*primals):
        found = vjp(fn, *primals, has_aux=has_aux)
        return (found[0], found[2]) if has_aux else found[0]

    def backward(cotangents, *primals):
        return vjp(fn, *primals, has_aux=has_aux)[1](cotangents)

    compiled_forward = _cached(fn, ("vjp forward", has_aux), lambda: _jitted(forward))
    compiled_backward = _cached(fn, ("vjp backward", has_aux), lambda: _jitted(backward))
    result = compiled_forward(*primals)

    def vjp_fn(cotangents):
        return compiled_backward(cotangents, *primals)

    if has_aux:
        output, aux = result
        return output, vjp_fn, aux
    return result, vjp_fn


def _in_dims_per_argument(in_dims, args: tuple) -> list:
    if in_dims is None or isinstance(in_dims, int):
        return [in_dims] * len(args)
    if isinstance(in_dims, (tuple, list)) and len(in_dims) == len(args):
        for d in in_dims:
            if d is not None and not isinstance(d, int):
                raise ThunderCoreError(
                    f"thunder_core.vmap: in_dims entries are an int or None per positional argument, got {d!r}; "
                    "a per-leaf structure of dims is not supported yet (pass one dim for the whole argument)"
                )
        return list(in_dims)
    raise ThunderCoreError(
        f"thunder_core.vmap: in_dims {in_dims!r} does not match the {len(args)} positional arguments: give an int, "
        "None, or a tuple with one entry per positional argument"
    )


def _batched_call(fn: Callable, args: tuple, kwargs: dict, in_dims, out_dims, randomness: str):
    """``fn`` recorded on one example's stand-ins, replayed on the batch (see thunder_core.batching)."""
    from thunder_core.batching import Batcher

    recorder = active_recorder()
    per_argument = _in_dims_per_argument(in_dims, args)
    sizes, batched_leaves = [], []  # a list: symbolic sizes are compared, not hashed
    stand_in_args = []
    for arg, dim in zip(args, per_argument):
        flat, spec = pytree.tree_flatten(arg)
        replaced = []
        for leaf in flat:
            if dim is None or not isinstance(leaf, TensorProxy):
                if dim is not None and not isinstance(leaf, TensorProxy) and leaf is not None:
                    raise ThunderCoreError(
                        f"thunder_core.vmap: in_dim {dim} given for a {type(leaf).__name__}; only tensors are "
                        "mapped (use None for this argument)"
                    )
                replaced.append(leaf)
                continue
            if not -leaf.ndim <= dim < leaf.ndim:
                raise ThunderCoreError(
                    f"thunder_core.vmap: in_dim {dim} is out of range for a tensor with {leaf.ndim} dimensions"
                )
            dim = dim % leaf.ndim
            sizes.append(leaf.shape[dim])
            per_example = [s for i, s in enumerate(leaf.shape) if i != dim]
            stand_in = TensorProxy(recorder.namer(), per_example, leaf.dtype, leaf.device, leaf.requires_grad)
            batched_leaves.append((stand_in, leaf, dim))
            replaced.append(stand_in)
        stand_in_args.append(pytree.tree_unflatten(replaced, spec))
    if not sizes:
        raise ThunderCoreError("thunder_core.vmap: no input is mapped; at least one tensor needs an in_dim")
    if any(other != sizes[0] for other in sizes[1:]):
        raise ThunderCoreError(
            f"thunder_core.vmap: the mapped dimensions have different sizes {sizes}; they must all be equal"
        )
    size = sizes[0]
    batcher = Batcher(size, randomness)
    with torch._C.DisableTorchFunction():
        from thunder_core.batching import _call

        for stand_in, leaf, dim in batched_leaves:
            batcher.bind(stand_in, leaf if dim == 0 else _call("movedim", leaf, dim, 0), True)
    inner = Recorder(recorder.namer, top_level=recorder.top_level, grad_on_at_call=recorder.grad_on_at_call)
    push_recorder(inner)
    try:
        result = fn(*stand_in_args, **kwargs)
    finally:
        pop_recorder()
    with torch._C.DisableTorchFunction():
        batcher.replay(inner.bound_symbols)
        flat, spec = pytree.tree_flatten(result)
        if isinstance(out_dims, int):
            dims = [out_dims] * len(flat)
        elif isinstance(out_dims, (tuple, list)) and len(out_dims) == len(flat):
            dims = list(out_dims)
        else:
            raise ThunderCoreError(
                f"thunder_core.vmap: out_dims {out_dims!r} does not match the function's {len(flat)} outputs"
            )
        outputs = []
        for leaf, dim in zip(flat, dims):
            if not isinstance(leaf, TensorProxy):
                raise ThunderCoreError(
                    f"thunder_core.vmap: the function must return tensors (or tuples, lists, dicts of them), "
                    f"got {type(leaf).__name__}"
                )
            value = batcher.value(leaf)
            if not batcher.is_batched(value):  # the same for every example: repeated, as torch.func does
                value = _call("expand", _call("unsqueeze", value, 0), (size, *value.shape))
            if dim is None:
                raise ThunderCoreError("thunder_core.vmap: out_dims=None is not supported yet")
            dim = dim % value.ndim
            outputs.append(value if dim == 0 else _call("movedim", value, 0, dim))
    return pytree.tree_unflatten(outputs, spec)


def _hashable(value):
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def vmap(
    fn: Callable,
    in_dims: int | None | tuple = 0,
    out_dims: int | tuple = 0,
    randomness: str = "error",
    *,
    chunk_size: int | None = None,
) -> Callable:
    """torch.func.vmap as a trace transform: ``fn`` mapped over dimension ``in_dims`` of its
    arguments (an int or None for all, or one per positional argument), the results stacked in
    dimension ``out_dims``. It nests with ``grad``, ``vjp`` and ``jvp`` (``vmap(grad(f))``: per-example
    gradients) and compiles into one trace under ``thunder_core.jit``. ``randomness``: ``"error"``
    (random operations are refused), ``"different"`` or ``"same"``, as torch.func's. ``chunk_size``
    is accepted for torch.func's signature; the whole batch is mapped at once."""
    from thunder_core.batching import RANDOMNESS

    if randomness not in RANDOMNESS:
        raise ThunderCoreError(
            f"thunder_core.vmap: randomness must be one of {RANDOMNESS}, got {randomness!r}"
        )
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ThunderCoreError(
            f"thunder_core.vmap: chunk_size must be a positive int or None, got {chunk_size!r}"
        )

    def inside(*args, **kwargs):
        return _batched_call(fn, args, kwargs, in_dims, out_dims, randomness)

    return _compiled_outside_capture(
        fn, ("vmap", _hashable(in_dims), _hashable(out_dims), randomness), inside
    )


record_vmap_with(vmap)  # torch.vmap called while a capture runs maps with this one (capture.torch_vmap)
