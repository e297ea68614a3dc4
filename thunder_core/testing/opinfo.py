"""Running PyTorch's OpInfo samples through thunder_core and comparing with eager.

Shared by the core's OpInfo tests and the executor conformance kit. ``jit_options`` are
passed to ``thunder_core.jit`` (e.g. ``{"executors": ["numba"]}``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

import thunder_core
from thunder_core.ir.interpret import eval_trace
from thunder_core.ir.symbols import OPAQUE

SAMPLES_PER_OP = 3


def op_db():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    return db


def opinfo_id(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


@dataclass
class SampleCase:
    fn: object  # takes the tensor leaves
    leaves: list


def sample_cases(opinfo, device="cpu", dtype=torch.float32, n=SAMPLES_PER_OP, requires_grad=False):
    """The op's first samples as functions of their tensor leaves."""
    cases = []
    for sample in opinfo.sample_inputs(device, dtype, requires_grad=requires_grad):
        flat, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        positions = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]

        def fn(*tensors, flat=flat, spec=spec, positions=positions):
            values = list(flat)
            for i, t in zip(positions, tensors):
                values[i] = t
            inp, args, kwargs = pytree.tree_unflatten(values, spec)
            return opinfo.op(inp, *args, **kwargs)

        cases.append(SampleCase(fn, [flat[i] for i in positions]))
        if len(cases) >= n:
            break
    return cases


def clone_leaves(leaves):
    return [t.clone() for t in leaves]


def draws_random_numbers(opinfo) -> bool:
    """OpInfos of random ops wrap the op in ``wrapper_set_seed``; uninitialized memory is random too."""
    code = getattr(opinfo.op, "__code__", None)
    return "empty" in opinfo.name or (code is not None and "wrapper_set_seed" in code.co_names)


def is_deterministic(case) -> bool:
    """Eager gives the same result twice and draws nothing from the random number generator.

    (Random OpInfos reseed inside the op, so comparing two runs is not enough: the RNG
    state moving is what gives them away.)
    """
    try:
        with torch.random.fork_rng():
            state = torch.get_rng_state()
            a = case.fn(*clone_leaves(case.leaves))
            if not torch.equal(state, torch.get_rng_state()):
                return False
            b = case.fn(*clone_leaves(case.leaves))
        torch.testing.assert_close(a, b, equal_nan=True)
    except Exception:
        return False
    return True


def _comparable(x):
    if isinstance(x, torch.Tensor) and x.dtype.itemsize == 1 and x.dtype.is_floating_point:
        return x.to(torch.float32)  # float8: assert_close only compares these bitwise
    return x


def assert_same(actual, expected):
    actual, expected = pytree.tree_map(_comparable, actual), pytree.tree_map(_comparable, expected)
    torch.testing.assert_close(actual, expected, equal_nan=True, atol=1e-5, rtol=1.3e-6)


def run_case(case, jit_options=None):
    """(result through thunder_core, eager result, the jitted function)."""
    expected = case.fn(*clone_leaves(case.leaves))
    jfn = thunder_core.jit(case.fn, **(jit_options or {}))
    actual = jfn(*clone_leaves(case.leaves))
    return actual, expected, jfn


def opaque_ops(trace) -> list[str]:
    return [b.symbol.printed_name for b in trace.bound_symbols if b.symbol.has_tag(OPAQUE)]


def run_decomposed(trace, case):
    return eval_trace(trace, *clone_leaves(case.leaves), decompose=True)


def grad_cases(opinfo, n=SAMPLES_PER_OP, device="cpu"):
    """Like ``sample_cases`` but with inputs that require grad (float32, on ``device``)."""
    return sample_cases(opinfo, device=device, n=n, requires_grad=True)


def _fresh_leaves(leaves):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]


def input_grads(fn, leaves, seed=0):
    """Gradients of sum(output * fixed random cotangent) w.r.t. the leaves that require grad."""
    leaves = _fresh_leaves(leaves)
    out = fn(*leaves)
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) for o in outs]
    wrt = [t for t in leaves if t.requires_grad]
    if not outs or not wrt:
        return None
    grads = torch.autograd.grad(outs, wrt, cotangents, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt)]


def check_grads(case, jit_options=None):
    """Compare thunder_core's input gradients with eager's; returns the jitted function."""
    expected = input_grads(case.fn, case.leaves)
    jfn = thunder_core.jit(case.fn, **(jit_options or {}))
    actual = input_grads(jfn, case.leaves)
    torch.testing.assert_close(actual, expected, equal_nan=True, atol=1e-4, rtol=1e-4)
    return jfn
