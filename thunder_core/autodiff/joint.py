"""Splitting a captured trace into a forward trace and a backward trace.

Pre: a trace whose inputs include tensors that require grad, with no in-place ops on
values that need gradients. Post: a forward trace with the same inputs returning
``(flat outputs, saved)`` and a backward trace taking ``(*saved, *output grads)`` and
returning one gradient (or None) per forward input. ``saved`` holds exactly the forward
values the backward reads.

Each bound symbol that needs a gradient is replayed through its VJP rule; without a rule
its decomposition is replayed; without either, PyTorch autograd differentiates it at
run time (``autograd_fallback``). Ops on complex tensors always take PyTorch autograd: the
rules are written for real numbers, and complex gradients follow PyTorch's conjugate
Wirtinger convention.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from thunder_core.autodiff import kernel_decompositions as _kernel_decompositions  # noqa: F401
from thunder_core.autodiff import prim_rules as _prim_rules  # noqa: F401  (registers prim rules)
from thunder_core.autodiff import rules as _rules  # noqa: F401  (registers torch-level rules)
from thunder_core.autodiff.fallback import fallback_rule
from thunder_core.autodiff.helpers import ops, sum_to
from thunder_core.autodiff.registry import AutogradOnly, NoRule, vjp_rule
from thunder_core.capture.recorder import Namer, Recorder
from thunder_core.errors import ThunderCoreError
from thunder_core.ir.proxies import PROXY_TYPES, NumberProxy, TensorProxy
from thunder_core.ir.symbolic import (
    has_symbolic_shape,
    same_sizes,
    size_symbols,
    symbol_source,
    symbols_used_by,
)
from thunder_core.ir.symbols import (
    INPLACE,
    NO_GRAD,
    OPAQUE,
    BoundSymbol,
    free_inputs,
    pop_recorder,
    push_recorder,
)
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ir.tree import leaves
from thunder_core.ops.effects import RetainedGrad, call_gradient_hook, register_hook, retain_grad
from thunder_core.transforms.replay import all_names
from thunder_core.transforms.updates import Aliases, written_arguments


class NotDifferentiable(ThunderCoreError):
    """The trace cannot be split (e.g. an in-place op on a value that needs a gradient)."""


@dataclass
class Split:
    forward: Trace
    backward: Trace
    output_differentiable: list[bool]  # per flat output leaf
    output_structure: object  # the user output with leaves replaced by their flat index
    names: dict = None  # a value's name in the given trace -> its name in the forward, where they differ
    retain_grad_outputs: tuple = ()  # flat output positions the program called retain_grad() on
    without_gradient: tuple = ()  # input positions that require grad but get none (unused by the outputs)
    # Per input, a bit mask of the flat outputs computed from it: when none of those receives a
    # gradient (the loss uses other outputs), eager leaves the input's gradient None, not zeros.
    outputs_reached: tuple = ()


def needs_grad(bsym: BoundSymbol) -> bool:
    if bsym.symbol.has_tag(NO_GRAD):
        return False  # run with grad mode off, as eager ran it: autograd does not record it
    inputs = any(isinstance(p, TensorProxy) and p.requires_grad for p in bsym.flat_args())
    if (
        inputs
        and bsym.symbol.has_tag(INPLACE)
        and not any(isinstance(p, TensorProxy) for p in bsym.flat_outputs())
    ):
        return True  # ``x[i] = v`` returns nothing, yet x now depends on v
    return inputs and any(isinstance(p, TensorProxy) and p.requires_grad for p in bsym.flat_outputs())


def requires_autodiff(trace: Trace) -> bool:
    """Some op computes a value that needs a gradient (proxies carry the grad mode of their op,
    so ``torch.enable_grad()`` regions inside a function called under ``no_grad`` count)."""
    return any(needs_grad(b) for b in trace.bound_symbols)


class _Replay:
    def __init__(self, namer: Namer, executors=(), inputs=()):
        self.executors = list(executors)
        self.inputs = {p.name for p in inputs}
        self.hooks: dict[str, list] = {}  # forward name of an intermediate -> gradient hooks, in order
        self.retained: set[str] = set()  # intermediates the program called retain_grad() on
        self.recorder = Recorder(namer, top_level=False)
        self.renamed: dict[int, object] = {}
        self.names: dict[str, str] = {}
        self.steps: list[tuple[object, object]] = []
        self.read_by_gradient: set[str] = set()  # alias roots of what differentiated operations read
        self.aliases = Aliases()

    def process(self, bsym: BoundSymbol, source) -> None:
        bsym = bsym.substitute(self.renamed)
        tensors = [p.name for p in bsym.flat_args() if isinstance(p, TensorProxy)]
        self.aliases.note(bsym, tensors)
        if bsym.symbol.has_tag(INPLACE) and self.read_by_gradient:
            changed = [self.aliases.root(p.name) for p in written_arguments(bsym)]
            if any(name in self.read_by_gradient for name in changed):
                # A backward reading it would see the new value: PyTorch autograd, recording the
                # whole program, checks such updates as in eager (it raises if the value was saved).
                raise NotDifferentiable(
                    f"{bsym.symbol.printed_name} updates in place a value that an earlier operation's gradient reads"
                )
        if bsym.symbol is register_hook or bsym.symbol is retain_grad:
            tensor = bsym.args[0]
            if tensor.name not in self.inputs:  # inputs: the call runs on the real tensor (kept below)
                if bsym.symbol is register_hook:
                    self.hooks.setdefault(tensor.name, []).append(bsym.args[1])
                else:
                    self.retained.add(tensor.name)
                return
        if not needs_grad(bsym):
            self.recorder.bound_symbols.append(bsym)
            return
        self.read_by_gradient.update(self.aliases.root(name) for name in tensors)
        if bsym.symbol.has_tag(INPLACE):
            raise NotDifferentiable(f"in-place {bsym.symbol.printed_name} on a value that needs a gradient")
        if _touches_complex(bsym):
            self._apply(fallback_rule(bsym.symbol), bsym, source)
            return
        rule = self._executor_rule(bsym) or vjp_rule(bsym.symbol)
        try:
            if rule is not None and self._apply(rule, bsym, source):
                return
        except AutogradOnly:
            self._apply(fallback_rule(bsym.symbol), bsym, source)
            return
        if bsym.subsymbols and not bsym.symbol.has_tag(OPAQUE):
            for sub in bsym.subsymbols:
                self.process(sub, source)
            return
        self._apply(fallback_rule(bsym.symbol), bsym, source)

    def _executor_rule(self, bsym: BoundSymbol):
        """An executor that will claim ``bsym`` may bring its own VJP rule (``grad=``)."""
        for executor in self.executors:
            impl = executor.implementation_for(bsym.symbol)
            if impl is not None and impl.grad is not None and executor.check(bsym) is True:
                return impl.grad
        return None

    def _apply(self, rule, bsym: BoundSymbol, source) -> bool:
        start = len(self.recorder.bound_symbols)
        try:
            out, backward = rule(*bsym.args, **bsym.kwargs)
        except AutogradOnly:
            del self.recorder.bound_symbols[start:]
            raise
        except NoRule:
            del self.recorder.bound_symbols[start:]
            return False
        for i in range(start, len(self.recorder.bound_symbols)):
            recorded = self.recorder.bound_symbols[i]
            if recorded.source is None:
                self.recorder.bound_symbols[i] = recorded.replace(source=source)
        for old, new in zip(leaves(bsym.output), leaves(out)):
            if isinstance(old, PROXY_TYPES) and old is not new:
                if (
                    isinstance(old, TensorProxy)
                    and isinstance(new, TensorProxy)
                    and old.requires_grad
                    and not any(new is arg for arg in bsym.flat_args())  # never a shared input
                ):
                    # The rule's value stands for the op's output, which capture found differentiable:
                    # so is the value (an executor's rule may make it with a symbol of its own
                    # whose meta leaves requires_grad False, which would cut the gradient path).
                    new.requires_grad_(True)
                self.renamed[id(old)] = new
                if isinstance(new, PROXY_TYPES):
                    self.names[old.name] = new.name
        self.steps.append((out, backward))
        return True


def _call_hooks(grads: dict, name: str, hooks) -> None:
    for hook in hooks:
        if grads.get(name) is not None:
            grads[name] = call_gradient_hook(hook, grads[name])


def _touches_complex(bsym: BoundSymbol) -> bool:
    return any(
        isinstance(p, TensorProxy) and p.dtype.is_complex for p in (*bsym.flat_args(), *bsym.flat_outputs())
    )


def _accumulate(grads: dict, proxy: TensorProxy, g) -> None:
    if not same_sizes(g.shape, proxy.shape):
        g = sum_to(g, proxy.shape)
    if g.dtype != proxy.dtype:
        g = ops.to(g, proxy.dtype)
    previous = grads.get(proxy.name)
    grads[proxy.name] = g if previous is None else ops.add(previous, g)


def _sizes_to_save(bsyms, inputs, forward_inputs) -> list[NumberProxy]:
    """An int input of the backward for each size symbol its operations use and none of its
    ``inputs`` gives (the gradient of ``x.reshape(-1, 2).sum(1)`` is reshaped back to the sizes
    of ``x``, which is not saved), saved by the forward, which binds every symbol from its own
    inputs. Each is named as the symbol prints (``s0``): the forward returns that name, the
    backward takes it. A symbol the forward reads only from a multiple of it is left out (the
    backward then cannot be printed with symbolic sizes, and the sizes stay fixed)."""
    if not any(
        has_symbolic_shape(p) or isinstance(getattr(p, "value", None), torch.SymInt) for p in forward_inputs
    ):
        return []
    missing = symbols_used_by(bsyms) - {symbol for symbol, _, _ in size_symbols(inputs)}
    if not missing:
        return []
    symbols = {symbol: size for symbol, size, _ in size_symbols(forward_inputs) if size.node.expr == symbol}
    names = {symbol: symbol_source(symbol, symbols[symbol]) for symbol in missing if symbol in symbols}
    return [
        NumberProxy(name, symbols[symbol]) for symbol, name in sorted(names.items(), key=lambda item: item[1])
    ]


def split_forward_backward(trace: Trace, executors=()) -> Split:
    start = time.perf_counter()
    namer = Namer(all_names(trace))
    replay = _Replay(namer, executors, trace.inputs)
    push_recorder(replay.recorder)
    try:
        for bsym in trace.bound_symbols:
            replay.process(bsym, bsym.source)
    finally:
        pop_recorder()

    def renamed(x):
        return replay.renamed.get(id(x), x)

    flat_outputs = [renamed(x) for x in leaves(trace.output)]
    differentiable = [isinstance(x, TensorProxy) and x.requires_grad for x in flat_outputs]
    counter = iter(range(len(flat_outputs)))
    from thunder_core.ir.tree import tree_map

    structure = tree_map(lambda _: next(counter), trace.output)
    forward_seconds = time.perf_counter() - start

    start = time.perf_counter()
    backward_recorder = Recorder(namer, top_level=False)
    grads: dict[str, object] = {}
    grad_inputs = []
    retained = {}
    for i, x in enumerate(flat_outputs):  # retain_grad() of a returned value: its .grad, filled last
        if isinstance(x, TensorProxy) and x.name in replay.retained and x.name not in retained:
            retained[x.name] = i
            replay.hooks.setdefault(x.name, []).append(RetainedGrad(i))
    push_recorder(backward_recorder)
    try:
        for x, is_diff in zip(flat_outputs, differentiable):
            if is_diff:
                g = TensorProxy(namer("g"), x.shape, x.dtype, x.device)
                grad_inputs.append(g)
                _accumulate(grads, x, g)
        for out, backward in reversed(replay.steps):
            outs = list(leaves(out))
            for x in outs:  # x's gradient is complete here: its hooks see it, as in eager
                if isinstance(x, TensorProxy):
                    _call_hooks(grads, x.name, replay.hooks.pop(x.name, ()))
            received = [grads.get(x.name) if isinstance(x, TensorProxy) else None for x in outs]
            if all(g is None for g in received):
                continue
            grad = received[0] if isinstance(out, TensorProxy) else received
            for proxy, g in backward(grad):
                if isinstance(proxy, TensorProxy) and proxy.requires_grad and g is not None:
                    _accumulate(grads, proxy, g)
        for name, hooks in list(replay.hooks.items()):  # tensors made inside that need a gradient (leaves)
            _call_hooks(grads, name, hooks)
    finally:
        pop_recorder()
    input_grads = tuple(
        grads.get(p.name) if isinstance(p, TensorProxy) and p.requires_grad else None for p in trace.inputs
    )

    # Drop gradients nobody asked for (inputs that need none) before deciding what to save.
    from thunder_core.transforms.dce import dce

    needed = dce(Trace(inputs=grad_inputs, bound_symbols=backward_recorder.bound_symbols, output=input_grads))
    saved = free_inputs(needed.bound_symbols, produced={g.name for g in grad_inputs})
    produced = {g.name for g in grad_inputs} | {
        p.name for b in needed.bound_symbols for p in b.flat_outputs()
    }
    for p in input_grads:  # a forward value returned as a gradient as it is
        if p is not None and p.name not in produced and p.name not in {s.name for s in saved}:
            saved.append(p)
    saved += _sizes_to_save(needed.bound_symbols, [*saved, *grad_inputs], trace.inputs)

    forward = Trace(
        inputs=trace.inputs,
        bound_symbols=replay.recorder.bound_symbols,
        output=(tuple(flat_outputs), tuple(saved)),
        function_name="forward",
        provenance=Provenance("autodiff: forward", forward_seconds),
    )
    backward = Trace(
        inputs=[*saved, *grad_inputs],
        bound_symbols=needed.bound_symbols,
        output=input_grads,
        function_name="backward",
        provenance=Provenance("autodiff: backward", time.perf_counter() - start),
    )
    without_gradient = tuple(
        i
        for i, (p, g) in enumerate(zip(trace.inputs, input_grads))
        if isinstance(p, TensorProxy) and p.requires_grad and g is None
    )
    return Split(
        forward,
        backward,
        differentiable,
        structure,
        replay.names,
        tuple(retained.values()),
        without_gradient,
        _outputs_reached(trace),
    )


def _outputs_reached(trace: Trace) -> tuple[int, ...]:
    """Per input of ``trace``, a bit mask of the flat outputs whose values it flows into (through
    any operation: a superset of those that pass it a gradient)."""
    reach = {p.name: 1 << i for i, p in enumerate(trace.inputs) if isinstance(p, TensorProxy)}
    for bsym in trace.bound_symbols:
        mask = 0
        for p in bsym.flat_args():
            if isinstance(p, TensorProxy):
                mask |= reach.get(p.name, 0)
        if mask:
            for p in bsym.flat_outputs():
                if isinstance(p, TensorProxy):
                    reach[p.name] = reach.get(p.name, 0) | mask
    reached = [0] * len(trace.inputs)
    for k, x in enumerate(leaves(trace.output)):
        inputs = reach.get(x.name, 0) if isinstance(x, TensorProxy) else 0
        i = 0
        while inputs:
            if inputs & 1:
                reached[i] |= 1 << k
            inputs >>= 1
            i += 1
    return tuple(reached)
