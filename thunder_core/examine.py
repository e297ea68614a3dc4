"""``thunder_core.examine``: what of a program thunder-core runs natively, and whether it agrees with eager.

Before anyone optimizes, it helps to know what the compiler sees: which operations it captured
as its own symbols, which it runs as opaque torch calls, which an installed executor could claim
but does not (and its checker's reason), and whether the compiled result (and, when the program
trains, its gradients) matches eager PyTorch's.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from thunder_core.capture.blocks import BLOCK
from thunder_core.explain import Explanation, explain
from thunder_core.inspection import _last
from thunder_core.ir.symbols import OPAQUE
from thunder_core.jit.function import ThunderFunction
from thunder_core.jit.module import ThunderModule


@dataclass
class Examination:
    """What ``examine`` found. Operation names are as traces print them (``torch.matmul``)."""

    native: Counter = field(default_factory=Counter)  # captured as thunder-core symbols: name -> calls
    opaque: Counter = field(default_factory=Counter)  # run as opaque torch calls: name -> calls
    executors: Counter = field(default_factory=Counter)  # executor -> operations it runs
    # (operation, executor) -> (the executor's reason for not claiming it, how many such operations)
    declined: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    matches_eager: bool | None = None  # None: not compared (the program did not run)
    max_difference: float | None = None  # largest absolute difference from eager over every tensor
    mismatch: str = ""  # what differs, when something does
    gradients_compared: int = 0  # parameter and input gradients compared with eager's
    error: str = ""  # why the program could not be compiled or run
    explanation: Explanation | None = None

    def __str__(self) -> str:
        lines = []
        if self.error:
            lines.append(f"could not compile or run: {self.error}")
        total = sum(self.native.values()) + sum(self.opaque.values())
        if total:
            lines.append(
                f"{sum(self.native.values())} of {total} captured operations are thunder-core symbols; "
                f"{sum(self.opaque.values())} run as opaque torch calls"
            )
        if self.opaque:
            lines.append("opaque torch calls (no thunder-core symbol; the torch executor runs them):")
            lines += [f"  {name}  x{n}" for name, n in self.opaque.most_common()]
        if self.executors:
            lines.append("executors: " + ", ".join(f"{name} {n}" for name, n in self.executors.most_common()))
        if self.declined:
            lines.append("operations an installed executor could claim but does not:")
            for (operation, executor), (reason, n) in sorted(self.declined.items()):
                lines.append(f"  {operation}  x{n}  {executor}: {reason}")
        if self.explanation is not None:
            lines += [f"note: {note}" for note in self.explanation.notes]
        if self.matches_eager is not None:
            verdict = "matches eager" if self.matches_eager else f"DIFFERS from eager: {self.mismatch}"
            grads = f", {self.gradients_compared} gradients" if self.gradients_compared else ""
            lines.append(
                f"numerical check (outputs{grads}): {verdict}; max abs difference {self.max_difference:.3g}"
            )
        return "\n".join(lines)


def examine(fn, *args, jit_options: Mapping[str, Any] | None = None, seed: int = 0, **kwargs) -> Examination:
    """Compile ``fn`` (a function or ``nn.Module``, or what ``thunder_core.jit`` returned: then
    with the options it was jitted with) on copies of itself and of ``args``/``kwargs`` with
    ``thunder_core.jit(..., **jit_options)``,
    run it and eager PyTorch with the same random seed, and say what runs where.

    When the result holds tensors that require grad, the sum of the outputs' means is differentiated
    in both and the gradients of parameters and inputs are compared too. Nothing of the
    caller's (the module's state, the arguments) is changed. An error while compiling or running
    is reported in ``Examination.error``, not raised.
    """
    original, options = _unjitted(fn)
    options.update(jit_options or {})
    found = Examination()
    reference, ref_inputs = _copies(original, args, kwargs)
    candidate, cand_inputs = _copies(original, args, kwargs)
    expected = _run(reference, ref_inputs, seed)
    jitted = _jit(candidate, options)
    try:
        result = _run(jitted, cand_inputs, seed)
    except Exception as error:  # noqa: BLE001 - reported, the point of examining
        found.error = f"{type(error).__name__}: {error}"
        _add_operations(found, jitted)
        return found
    _add_operations(found, jitted)
    _compare(found, expected, result, (reference, ref_inputs), (candidate, cand_inputs))
    return found


def _unjitted(fn) -> tuple[Any, dict]:
    """The eager function or module, and the options it was jitted with (none for eager ones)."""
    if isinstance(fn, (ThunderModule, ThunderFunction)):
        options = {k: v for k, v in (fn._arguments or {}).items() if v is not None}
        return (fn._model if isinstance(fn, ThunderModule) else fn._fn), options
    return fn, {}


def _copies(fn, args, kwargs):
    """A copy of the module (or of the module a bound method belongs to) and of the arguments,
    so both runs start alike and neither touches the caller's. A plain function is shared: what
    it closes over is the caller's."""
    if isinstance(fn, nn.Module):
        module = copy.deepcopy(fn)
    elif isinstance(getattr(fn, "__self__", None), nn.Module):  # jit(model.forward)
        module = getattr(copy.deepcopy(fn.__self__), fn.__name__)
    else:
        module = fn
    try:
        inputs = copy.deepcopy((args, kwargs))
    except Exception:  # noqa: BLE001 - a non-leaf tensor or an object that cannot be copied
        inputs = tree_map(_tensor_copy, (args, kwargs))
    return module, inputs


def _tensor_copy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def _jit(fn, options):
    from thunder_core import jit

    return jit(fn, **dict(options or {}))


def _run(fn, inputs, seed: int):
    args, kwargs = inputs
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn(*args, **kwargs)


def _add_operations(found: Examination, jitted) -> None:
    try:
        compiled = _last(jitted)
    except RuntimeError:  # nothing compiled: capture failed
        return
    _count(found, compiled.traces[0], 1)
    found.explanation = explain(jitted)
    for report in found.explanation.operations:
        found.executors[report.executor] += 1
        operation = report.operation.split("(", 1)[0]
        for executor, reason in report.declined.items():
            if reason.startswith("no implementation for"):  # not an operation it could claim
                continue
            previous = found.declined.get((operation, executor))
            found.declined[(operation, executor)] = (reason, (previous[1] if previous else 0) + 1)


def _count(found: Examination, trace, times: int) -> None:
    for bsym in trace.bound_symbols:
        name = _operation(bsym.symbol)
        if bsym.symbol.name == "del":
            continue
        if bsym.symbol.has_tag(BLOCK):
            _count_subsymbols(found, bsym.subsymbols, times)  # a repeated block's call: its operations
            continue
        if bsym.symbol.has_tag(OPAQUE):
            found.opaque[name] += times
        else:
            found.native[name] += times


def _count_subsymbols(found: Examination, subsymbols, times: int) -> None:
    for sub in subsymbols:
        counter = found.opaque if sub.symbol.has_tag(OPAQUE) else found.native
        counter[_operation(sub.symbol)] += times


def _operation(symbol) -> str:
    """The operation a symbol runs (an operation of a ``no_grad`` region counts as itself)."""
    return (symbol.plain or symbol).printed_name


def _compare(found: Examination, expected, result, reference, candidate) -> None:
    expected_leaves, _ = tree_flatten(expected)
    result_leaves, _ = tree_flatten(result)
    pairs = [
        (f"output {i}", e, r)
        for i, (e, r) in enumerate(zip(expected_leaves, result_leaves))
        if isinstance(e, torch.Tensor)
    ]
    problems = []
    if len(expected_leaves) != len(result_leaves):
        problems.append(f"{len(result_leaves)} outputs instead of {len(expected_leaves)}")
    differentiable = [
        (e, r)
        for _, e, r in pairs
        if e.requires_grad and r.requires_grad and (e.is_floating_point() or e.is_complex())
    ]
    if differentiable:
        for outputs in zip(*differentiable):
            sum((o.real if o.is_complex() else o).mean() for o in outputs).backward()
        pairs += _gradient_pairs(reference, candidate)
        found.gradients_compared = sum(1 for name, _, _ in pairs if name.startswith("gradient"))
    found.max_difference = 0.0
    for name, e, r in pairs:
        if not isinstance(r, torch.Tensor):
            problems.append(f"{name}: {type(r).__name__} instead of a tensor")
            continue
        if e.shape == r.shape and e.dtype == r.dtype and e.numel():
            difference = (e.detach() - r.detach()).abs().max()
            found.max_difference = max(
                found.max_difference, float(difference.real if e.is_complex() else difference)
            )
        try:
            torch.testing.assert_close(r, e, equal_nan=True)
        except AssertionError as error:
            problems.append(f"{name}: {str(error).splitlines()[0]}")
    found.matches_eager = not problems
    found.mismatch = "; ".join(problems[:5])


def _gradient_pairs(reference, candidate) -> list:
    (ref_module, (ref_args, ref_kwargs)), (cand_module, (cand_args, cand_kwargs)) = reference, candidate
    ref_module, cand_module = (getattr(m, "__self__", m) for m in (ref_module, cand_module))  # bound methods
    pairs = []
    if isinstance(ref_module, nn.Module) and isinstance(cand_module, nn.Module):
        for (name, p), q in zip(ref_module.named_parameters(), cand_module.parameters()):
            if p.grad is not None or q.grad is not None:
                pairs.append((f"gradient of {name}", _grad(p), _grad(q)))
    ref_leaves, _ = tree_flatten((ref_args, ref_kwargs))
    cand_leaves, _ = tree_flatten((cand_args, cand_kwargs))
    for i, (a, b) in enumerate(zip(ref_leaves, cand_leaves)):
        if isinstance(a, torch.Tensor) and a.requires_grad and a.is_leaf:
            pairs.append((f"gradient of input {i}", _grad(a), _grad(b)))
    return pairs


def _grad(p: torch.Tensor):
    return p.grad if p.grad is not None else torch.zeros_like(p)
