"""Forward-mode differentiation of a recorded program: ``jvp`` with rules of its own.

The function is recorded once on stand-ins of the primals; each recorded operation is then
replayed on the real values, and where an input carries a tangent, the operation's forward-mode
rule gives its outputs' tangents (``J @ t``, pushed forward in the program's order, alongside
it). Without a rule, an operation's decomposition is replayed (down to prims, which have rules);
an operation with neither runs through ``torch.func.jvp`` on its own (the symbol
``torch_func_jvp``, which the trace and ``explain`` show), PyTorch's own forward-mode formulas.
"""

from __future__ import annotations

import math

import torch

from thunder_core.capture.meta import run_on_meta
from thunder_core.ir.proxies import PROXY_TYPES, TensorProxy
from thunder_core.ir.symbolic import same_sizes
from thunder_core.ir.symbols import AUTOGRAD_FALLBACK, INPLACE, OPAQUE, Symbol, active_recorder
from thunder_core.ir.tree import leaves, tree_map


class NotForwardDifferentiable(Exception):
    """An operation forward mode cannot push a tangent through (an autograd-fallback backward, an
    in-place update)."""


def _jvp_impl(name, fn, args, kwargs, positions, tangents):
    flat = list(leaves((args, kwargs)))

    def at(*differentiated):
        values = list(flat)
        for i, value in zip(positions, differentiated):
            values[i] = value
        remaining = iter(values)
        call_args, call_kwargs = tree_map(lambda _: next(remaining), (args, kwargs))
        return fn(*call_args, **call_kwargs)

    return torch.func.jvp(at, tuple(flat[i] for i in positions), tuple(tangents))


def _jvp_meta(name, fn, args, kwargs, positions, tangents):
    # The outputs' metadata from ``fn`` alone, the tangents shaped like them: ``torch.func.jvp``
    # is not run on meta tensors (an op failing there can leave functorch's state broken for the
    # whole process).
    recorder = active_recorder()
    out = run_on_meta(fn, args, kwargs, recorder.new_proxy, inplace=False)
    tangents_out = tree_map(
        lambda y: (
            recorder.new_proxy(y.shape, y.dtype, y.device, False, y.stride())
            if isinstance(y, TensorProxy)
            else y
        ),
        out,
    )
    return out, tangents_out


#: One operation without a forward-mode rule (named by its first argument), differentiated by
#: ``torch.func.jvp``: returns ``(outputs, output tangents)``.
torch_func_jvp = Symbol(name="torch_func_jvp", impl=_jvp_impl, printed_name="torch_func_jvp", meta=_jvp_meta)


def _call(name: str, *args, **kwargs):
    from thunder_core.ops.registry import TORCH_SYMBOLS

    return TORCH_SYMBOLS[name](*args, **kwargs)


def _differentiable(x) -> bool:
    return isinstance(x, TensorProxy) and (x.dtype.is_floating_point or x.dtype.is_complex)


class Pushforward:
    """Replays recorded operations on real values, carrying tangents (None: zero) alongside."""

    def __init__(self):
        self.values: dict[int, object] = {}  # id of a recorded value -> its replayed value
        self.tangents: dict[int, object] = {}  # id of a replayed value -> its tangent proxy

    def bind(self, recorded, value, tangent=None) -> None:
        self.values[id(recorded)] = value
        if tangent is not None:
            self.tangents[id(value)] = tangent

    def value(self, recorded):
        return self.values.get(id(recorded), recorded) if isinstance(recorded, PROXY_TYPES) else recorded

    def tangent(self, value):
        return self.tangents.get(id(value)) if isinstance(value, TensorProxy) else None

    def replay(self, bound_symbols) -> None:
        for bsym in bound_symbols:
            args, kwargs = tree_map(self.value, bsym.args), tree_map(self.value, bsym.kwargs)
            if not any(self.tangent(x) is not None for x in leaves((args, kwargs))):
                self._bind(bsym.output, bsym.symbol(*args, **kwargs), None)
                continue
            if bsym.symbol.has_tag(INPLACE):
                # The base of a view it writes through would keep a stale tangent: the caller
                # takes the transpose of the VJP, which refuses in-place updates with the reason.
                # (Before the check below: ``x[i] = v`` returns nothing, yet changes x's tangent.)
                raise NotForwardDifferentiable(bsym.symbol.printed_name)
            if not any(_differentiable(y) for y in leaves(bsym.output)):
                # comparisons, integer results: no tangent flows through them
                self._bind(bsym.output, bsym.symbol(*args, **kwargs), None)
                continue
            rule = _RULES.get(_key(bsym.symbol))
            if rule is not None:
                found = rule(self, bsym.symbol, args, kwargs)
                if found is not None:
                    self._bind(bsym.output, *found)
                    continue
            if bsym.subsymbols and not bsym.symbol.has_tag(OPAQUE):
                self.replay(bsym.subsymbols)
                continue
            if bsym.symbol.has_tag(AUTOGRAD_FALLBACK):
                # PyTorch autograd's graph, kept in a handle from the forward: torch.func.jvp
                # cannot push a tangent through it. The caller takes the transpose of the VJP.
                raise NotForwardDifferentiable(bsym.symbol.printed_name)
            self._fallback(bsym, args, kwargs)

    def _bind(self, recorded, out, tangents) -> None:
        flat_tangents = [None] * len(list(leaves(out))) if tangents is None else list(leaves(tangents))
        for old, new, t in zip(leaves(recorded), leaves(out), flat_tangents):
            if isinstance(old, PROXY_TYPES):
                self.bind(old, new, t if _differentiable(new) else None)

    def _fallback(self, bsym, args, kwargs) -> None:
        flat = list(leaves((args, kwargs)))
        positions = tuple(i for i, x in enumerate(flat) if self.tangent(x) is not None)
        tangents = tuple(self.tangent(flat[i]) for i in positions)
        out, out_tangents = torch_func_jvp(
            bsym.symbol.printed_name, bsym.symbol.impl, args, kwargs, positions, tangents
        )
        self._bind(bsym.output, out, out_tangents)


def _key(symbol: Symbol) -> str:
    return f"prims.{symbol.name}" if symbol.is_prim else symbol.name


def _zero_if_none(t, like):
    return _call("zeros_like", like) if t is None else t


# Rules: (pushforward, symbol, args, kwargs) -> (outputs, output tangents) or None to decline.


def _linear_in_first(push, symbol, args, kwargs):
    """Ops linear in their one tensor argument (views, reshapes, sums, casts): the same op on the tangent."""
    tensors = [x for x in leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    if len(tensors) != 1 or not isinstance(args[0], TensorProxy):
        return None
    if symbol.name == "view" and any(isinstance(x, torch.dtype) for x in leaves((args, kwargs))):
        return None  # view(dtype) reinterprets bits: not linear
    out = symbol(*args, **kwargs)
    return out, symbol(push.tangent(args[0]), *args[1:], **kwargs)


def _sum_of(push, symbol, args, kwargs, sign: float = 1.0):
    a, b = args[0], args[1]
    alpha = kwargs.get("alpha", 1)
    if set(kwargs) - {"alpha"}:
        return None
    out = symbol(a, b, **kwargs)
    ta, tb = push.tangent(a), push.tangent(b)
    terms = []
    if ta is not None:
        terms.append(ta)
    if tb is not None:
        terms.append(_call("mul", tb, sign * alpha) if (sign * alpha) != 1 else tb)
    return out, _broadcast_to(_total(terms), out)


def _broadcast_to(tangent, out):
    if not same_sizes(tangent.shape, out.shape):
        tangent = _call("expand", tangent, tuple(out.shape))
    if tangent.dtype != out.dtype:
        tangent = _call("to", tangent, out.dtype)
    return tangent


def _add(push, symbol, args, kwargs):
    return _sum_of(push, symbol, args, kwargs) if len(args) == 2 else None


def _sub(push, symbol, args, kwargs):
    return _sum_of(push, symbol, args, kwargs, sign=-1.0) if len(args) == 2 else None


def _total(terms: list):
    """The sum of the tangent contributions (at least one)."""
    tangent = terms[0]
    for term in terms[1:]:
        tangent = _call("add", tangent, term)
    return tangent


def _binary(of_first, of_second):
    """``f(a, b)``: the tangent is ``of_first(t_a, a, b, out) + of_second(t_b, a, b, out)``, each
    term present where its argument carries a tangent."""

    def rule(push, symbol, args, kwargs):
        if len(args) != 2 or kwargs:
            return None
        a, b = args
        out = symbol(a, b)
        pairs = ((of_first, push.tangent(a)), (of_second, push.tangent(b)))
        return out, _broadcast_to(_total([of(t, a, b, out) for of, t in pairs if t is not None]), out)

    return rule


_mul = _binary(lambda t, a, b, out: _call("mul", t, b), lambda t, a, b, out: _call("mul", a, t))
_div = _binary(
    lambda t, a, b, out: _call("div", t, b),
    lambda t, a, b, out: _call("neg", _call("div", _call("mul", out, t), b)),
)
_matmul = _binary(lambda t, a, b, out: _call("matmul", t, b), lambda t, a, b, out: _call("matmul", a, t))


def _unary(derivative):
    """Elementwise ``f(x)``: the tangent is ``f'(x) * t``, with ``derivative(x, out)`` giving ``f'``."""

    def rule(push, symbol, args, kwargs):
        if len(args) != 1 or kwargs or not isinstance(args[0], TensorProxy) or args[0].dtype.is_complex:
            return None  # the formulas are for real numbers; complex inputs take torch.func.jvp
        x = args[0]
        out = symbol(x)
        return out, _call("mul", push.tangent(x), derivative(x, out))

    return rule


_UNARY = {
    "exp": lambda x, out: out,
    "log": lambda x, out: _call("reciprocal", x),
    "tanh": lambda x, out: _call("rsub", _call("mul", out, out), 1),
    "sigmoid": lambda x, out: _call("mul", out, _call("rsub", out, 1)),
    "sin": lambda x, out: _call("cos", x),
    "cos": lambda x, out: _call("neg", _call("sin", x)),
    "sqrt": lambda x, out: _call("div", _call("reciprocal", out), 2),
    "rsqrt": lambda x, out: _call("mul", _call("mul", _call("mul", out, out), out), -0.5),
    "erf": lambda x, out: _call(
        "mul", _call("exp", _call("neg", _call("mul", x, x))), 2 / math.sqrt(math.pi)
    ),
    "relu": lambda x, out: _call("to", _call("gt", x, 0), x.dtype),
    "neg": lambda x, out: -1.0,
}


def _linear(push, symbol, args, kwargs):
    x = args[0]
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    out = symbol(*args, **kwargs)
    tx, tw, tb = push.tangent(x), push.tangent(weight), push.tangent(bias)
    terms = []
    if tx is not None:
        terms.append(_call("linear", tx, weight))
    if tw is not None:
        terms.append(_call("linear", x, tw))
    if tb is not None:
        terms.append(_broadcast_to(tb, out))
    return out, _total(terms)


def _softmax(push, symbol, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None or (len(args) > 2 and args[2] is not None) or kwargs.get("dtype") is not None:
        return None
    out = symbol(*args, **kwargs)
    t = push.tangent(x)
    weighted = _call("sum", _call("mul", out, t), dim, True)
    return out, _call("mul", out, _call("sub", t, weighted))


def _where(push, symbol, args, kwargs):
    if len(args) != 3 or kwargs:
        return None
    condition, a, b = args
    out = symbol(condition, a, b)
    ta = push.tangent(a) if isinstance(a, TensorProxy) else None
    tb = push.tangent(b) if isinstance(b, TensorProxy) else None
    ta = _call("zeros_like", out) if ta is None else ta
    tb = _call("zeros_like", out) if tb is None else tb
    return out, _call("where", condition, ta, tb)


def _cat(push, symbol, args, kwargs):
    tensors = args[0] if args and isinstance(args[0], (list, tuple)) else None
    if tensors is None or any(isinstance(x, TensorProxy) for x in leaves((args[1:], kwargs))):
        return None
    out = symbol(*args, **kwargs)
    tangents = [_zero_if_none(push.tangent(x), x) for x in tensors]
    return out, symbol(tangents, *args[1:], **kwargs)


def _pow(push, symbol, args, kwargs):
    if len(args) != 2 or kwargs or isinstance(args[1], TensorProxy) or not isinstance(args[0], TensorProxy):
        return None
    x, exponent = args
    out = symbol(x, exponent)
    if exponent == 0:  # x ** 0 is 1 everywhere, also at 0 (where 0 * x ** -1 would be nan)
        return out, _call("zeros_like", out)
    derivative = _call("mul", _call("pow", x, exponent - 1), exponent) if exponent != 1 else 1.0
    return out, _call("mul", push.tangent(x), derivative)


def _linear_in_first_of_indices(push, symbol, args, kwargs):
    """``gather(a, dim, index)``, ``take(a, index, dim)``: linear in ``a``, given integer indices."""
    if kwargs or any(push.tangent(x) is not None for x in args[1:]):
        return None
    return symbol(*args), symbol(push.tangent(args[0]), *args[1:])


def _scatter(push, symbol, args, kwargs):
    """``scatter(a, dim, index, src)`` (and ``scatter_add``): linear in ``a`` and ``src`` together."""
    if kwargs or len(args) != 4 or not isinstance(args[3], TensorProxy):
        return None
    a, dim, index, src = args
    out = symbol(a, dim, index, src)
    return out, symbol(_zero_if_none(push.tangent(a), a), dim, index, _zero_if_none(push.tangent(src), src))


def _constant(push, symbol, args, kwargs):
    """Piecewise-constant ops (floor, round, sign, ...): a zero tangent."""
    out = symbol(*args, **kwargs)
    return out, _call("zeros_like", out)


def _through_the_vjp(push, symbol, args, kwargs):
    """Elementwise prims (of real tensors of one shape): each input's Jacobian is diagonal, so its
    tangent contribution is the VJP rule's gradient for that input with the tangent as the
    cotangent. The sum over the inputs that carry a tangent."""
    from thunder_core.autodiff import prim_rules  # noqa: F401  (registers the prims' VJP rules)
    from thunder_core.autodiff.registry import vjp_rule

    rule = vjp_rule(symbol)
    tensors = [x for x in leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    if (
        rule is None
        or any(x.dtype.is_complex for x in tensors)
        or len({tuple(x.shape) for x in tensors}) != 1
        or len({id(x) for x in tensors}) != len(tensors)  # one tensor twice: its gradients would add up
    ):
        return None
    out, backward = rule(*args, **kwargs)
    terms = []
    for x in args:
        tangent = push.tangent(x)
        if tangent is None:
            continue
        grads = [g for inp, g in backward(tangent) if inp is x]
        if len(grads) != 1 or grads[0] is None:
            return None  # the call is recorded but unused: dead code, removed with the rest
        terms.append(grads[0])
    return out, _broadcast_to(_total(terms), out)


def _extremum(push, symbol, args, kwargs):
    """``amax(a, dims)`` / ``amin``: the tangent at the extreme values, shared equally among ties
    (as the VJP shares the gradient)."""
    if kwargs or len(args) != 2:
        return None
    a, dims = args
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if not dims or a.dtype.is_complex:
        return None
    out = symbol(a, dims)
    kept = tuple(1 if d in dims else size for d, size in enumerate(a.shape))
    hits = _call("to", _call("eq", a, _call("reshape", out, kept)), a.dtype)
    total = _call("sum", _call("mul", push.tangent(a), hits), dims)
    return out, _call("div", total, _call("sum", hits, dims))


def _var(push, symbol, args, kwargs):
    if kwargs or len(args) != 3:
        return None
    a, dims, correction = args
    count = math.prod(a.shape[d] for d in dims)
    if not dims or count <= correction or a.dtype.is_complex:
        return None
    out = symbol(a, dims, correction)
    centered = _call("sub", a, _call("mean", a, list(dims), True))
    total = _call("sum", _call("mul", centered, push.tangent(a)), list(dims))
    return out, _call("mul", total, 2 / (count - correction))


_LINEAR = (
    "reshape view permute transpose t unsqueeze squeeze expand flatten contiguous clone sum mean "
    "getitem movedim"
).split()
_UNARY.update(
    {
        "reciprocal": lambda x, out: _call("neg", _call("mul", out, out)),
        "expm1": lambda x, out: _call("add", out, 1),
        "log1p": lambda x, out: _call("reciprocal", _call("add", x, 1)),
        "abs": lambda x, out: _call("sign", x),
        "sinh": lambda x, out: _call("cosh", x),
        "cosh": lambda x, out: _call("sinh", x),
        "exp2": lambda x, out: _call("mul", out, math.log(2)),
        "log2": lambda x, out: _call("reciprocal", _call("mul", x, math.log(2))),
        "log10": lambda x, out: _call("reciprocal", _call("mul", x, math.log(10))),
        "tan": lambda x, out: _call("add", _call("mul", out, out), 1),
        "atan": lambda x, out: _call("reciprocal", _call("add", _call("mul", x, x), 1)),
    }
)
_PRIM_LINEAR = "reshape permute broadcast_in_dim squeeze sum cumsum flip slice convert_element_type".split()
_RULES = {name: _linear_in_first for name in _LINEAR}
_RULES.update({f"prims.{name}": _linear_in_first for name in _PRIM_LINEAR})
_RULES.update({name: _unary(derivative) for name, derivative in _UNARY.items()})
_RULES.update({f"prims.{name}": _unary(derivative) for name, derivative in _UNARY.items()})
_RULES.update(
    {
        "prims.add": _add,
        "prims.sub": _sub,
        "prims.mul": _mul,
        "prims.div": _div,
        "prims.matmul": _matmul,
        "prims.where": _where,
        "prims.cat": _cat,
        "prims.pow": _pow,
        "cat": _cat,
        "pow": _pow,
    }
)
_THROUGH_THE_VJP = (
    "asin acos asinh acosh atanh erfc erfinv lgamma digamma maximum minimum atan2 copysign fmod remainder"
).split()
_RULES.update({f"prims.{name}": _through_the_vjp for name in _THROUGH_THE_VJP})
_RULES.update({f"prims.{name}": _constant for name in "floor ceil round trunc sign".split()})
_RULES.update(
    {
        "prims.amax": _extremum,
        "prims.amin": _extremum,
        "prims.var": _var,
        "prims.gather": _linear_in_first_of_indices,
        "prims.take": _linear_in_first_of_indices,
        "prims.scatter": _scatter,
        "prims.scatter_add": _scatter,
    }
)
_RULES.update(
    {
        "add": _add,
        "sub": _sub,
        "mul": _mul,
        "div": _div,
        "matmul": _matmul,
        "linear": _linear,
        "softmax": _softmax,
        "where": _where,
    }
)


def pushforward(fn, primals: tuple, tangents: tuple, has_aux: bool):
    """``fn`` recorded on stand-ins of ``primals`` and replayed with ``tangents`` carried alongside:
    ``(flat outputs, flat output tangents, aux)``, every output tangent a tensor (zeros where
    nothing flows)."""
    from torch.utils import _pytree as pytree

    from thunder_core.capture.recorder import Recorder
    from thunder_core.errors import ThunderCoreError
    from thunder_core.ir.symbols import pop_recorder, push_recorder

    recorder = active_recorder()
    flat_primals, spec = pytree.tree_flatten(primals)
    flat_tangents = pytree.tree_leaves(tangents)
    push = Pushforward()
    stand_ins = []
    for primal, tangent in zip(flat_primals, flat_tangents):
        if not isinstance(primal, TensorProxy):
            stand_ins.append(primal)
            continue
        stand_in = TensorProxy(
            recorder.namer(), primal.shape, primal.dtype, primal.device, primal.requires_grad
        )
        push.bind(stand_in, primal, tangent if _differentiable(primal) else None)
        stand_ins.append(stand_in)
    inner = Recorder(recorder.namer, top_level=recorder.top_level, grad_on_at_call=recorder.grad_on_at_call)
    push_recorder(inner)
    try:
        result = fn(*pytree.tree_unflatten(stand_ins, spec))
    finally:
        pop_recorder()
    if has_aux:
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ThunderCoreError(
                f"thunder_core: with has_aux=True the function must return (output, aux), got {type(result).__name__}"
            )
        output, aux = result
    else:
        output, aux = result, None
    with torch._C.DisableTorchFunction():
        push.replay(inner.bound_symbols)
        outputs = [push.value(x) for x in pytree.tree_leaves(output)]
        output_tangents = [
            (_call("zeros_like", x) if push.tangent(x) is None else push.tangent(x)) for x in outputs
        ]
    aux = tree_map(push.value, aux)
    return outputs, output_tangents, aux, pytree.tree_structure(output)
