"""Inductor's own options for a job (``options={"inductor": {"cpp_wrapper": True}}``): they reach
the compiler, and a region compiled with them behaves as one compiled without."""

from __future__ import annotations

import pytest
import torch

import thunder_core


def test_inductor_options_reach_the_compiler():
    def fn(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(16)
    jfn = thunder_core.jit(fn, executors=["inductor"], options={"inductor": {"cpp_wrapper": True}})
    torch.testing.assert_close(jfn(x), fn(x))
    executor = thunder_core.explain(jfn)  # the job's executor is configured per job, not shared
    job_executor = jfn._job.executors[0]
    assert job_executor.inductor_options == {"cpp_wrapper": True} and executor.executors[0] == "inductor"
    region = next(b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor")
    assert region.impl.failure is None  # compiled and ran with the C++ wrapper, no fallback to torch


def test_cpp_wrapper_is_in_the_generated_code():
    from thunder_executor_inductor._backend import _compile_static

    def region(x):
        return (torch.sin(x) * 2 + 1,)

    x = torch.randn(16)
    with_wrapper = _compile_static(region, [torch.empty_like(x)], {"cpp_wrapper": True})
    without = _compile_static(region, [torch.empty_like(x)], {})
    torch.testing.assert_close(with_wrapper(x)[0], region(x)[0])
    assert (
        "inductor_entry_impl" in with_wrapper.source_code and "inductor_entry_impl" not in without.source_code
    )


@pytest.mark.parametrize("cpp_wrapper", [False, True], ids=["python-wrapper", "cpp-wrapper"])
def test_a_symbolic_region_given_other_strides_than_compiled_for_runs_its_operations(cpp_wrapper):
    # The generated code asserts its inputs' strides (an AssertionError in Python, a RuntimeError
    # from cpp_wrapper's C++): either way the region's own operations give the result.
    from thunder_executor_inductor._backend import _compile_symbolic
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    def region(x):
        return ((x.sin() * 2).cumsum(1),)

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    example = fake_mode.from_tensor(torch.randn(5, 6), symbolic_context=dynamic)
    compiled = _compile_symbolic(region, [example], {"cpp_wrapper": True} if cpp_wrapper else {})
    contiguous = torch.randn(7, 3)
    torch.testing.assert_close(compiled(contiguous)[0], region(contiguous)[0])
    transposed = torch.randn(3, 7).t()  # sizes the code takes, strides it was not compiled for
    torch.testing.assert_close(compiled(transposed)[0], region(transposed)[0])


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def _normalized(x):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-5).sqrt()


def _residual_rms_norm(x, weight):
    return torch.nn.functional.rms_norm(x + x.tanh(), (x.shape[-1],), weight, 1e-6)


def _linear_gelu(x, weight, bias):
    # eager adds the bias inside the product and rounds once: the linear stays whole
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias)) * 2 + 1


LOW_PRECISION_PROGRAMS = {
    "rope": (_rope, lambda: (torch.randn(4, 16, 64), torch.randn(16, 64), torch.randn(16, 64))),
    "normalized": (_normalized, lambda: (torch.randn(4, 16, 64),)),
    "residual-rms-norm": (_residual_rms_norm, lambda: (torch.randn(4, 16, 64), torch.randn(64))),
    "linear-gelu": (
        _linear_gelu,
        lambda: (torch.randn(4, 16, 64), torch.randn(48, 64) * 0.1, torch.randn(48)),
    ),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(LOW_PRECISION_PROGRAMS))
def test_low_precision_regions_round_as_eager(name, dtype, dynamic, monkeypatch):
    """A fused chain of float16/bfloat16 operations computed in float32 and rounded once (what
    torch.compile's Inductor does) is several units in the last place from eager, past
    ``assert_close``'s tolerance for the dtype; regions round each intermediate as eager does."""
    monkeypatch.setenv("THUNDER_CORE_STRICT", "1")  # a region given back to torch is an error
    fn, make = LOW_PRECISION_PROGRAMS[name]
    torch.manual_seed(0)
    args = tuple(a.to(dtype) for a in make())
    jfn = thunder_core.jit(fn, executors=["inductor"], dynamic=dynamic)
    torch.testing.assert_close(jfn(*args), fn(*args))
    regions = [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]
    assert regions and all(r.impl.failure is None for r in regions)


def test_eager_rounding_can_be_turned_off():
    args = (torch.randn(4, 16, 64, dtype=torch.bfloat16),)
    jfn = thunder_core.jit(
        _normalized, executors=["inductor"], options={"inductor": {"eager_rounding": False}}
    )
    torch.testing.assert_close(jfn(*args), _normalized(*args), atol=0.02, rtol=0.05)
    assert jfn._job.executors[0].inductor_options == {"emulate_precision_casts": False}


BACKWARD_PROGRAMS = {
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
    "tanh": torch.tanh,
    "softmax": lambda x: x.softmax(-1),
    "log_softmax": lambda x: x.log_softmax(-1),
    "addcmul": lambda x: torch.addcmul(x, x, x.flip(0), value=0.3),
    "mish": torch.nn.functional.mish,
    "softplus": lambda x: torch.nn.functional.softplus(x, beta=3),
    "elu": torch.nn.functional.elu,
    "selu": torch.nn.functional.selu,
    "hardswish": torch.nn.functional.hardswish,
    "logsigmoid": torch.nn.functional.logsigmoid,
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(BACKWARD_PROGRAMS))
def test_low_precision_gradients_round_as_eager(name, dtype, monkeypatch):
    """Eager's backward kernels (gelu's, softmax's, ...) compute float16/bfloat16 in float32 and
    round once; their decompositions do too, so a region that rounds each intermediate as
    eager's separate kernels do still gives eager's gradients."""
    monkeypatch.setenv("THUNDER_CORE_STRICT", "1")
    fn = BACKWARD_PROGRAMS[name]
    torch.manual_seed(0)
    x = torch.randn(4, 16, 64, dtype=dtype)
    jfn = thunder_core.jit(fn, executors=["inductor"])
    expected_x, got_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = fn(expected_x), jfn(got_x)
    torch.testing.assert_close(got, expected)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad)
    torch.testing.assert_close(got_x.grad, expected_x.grad)
    regions = [
        b for b in thunder_core.last_backward_traces(jfn)[-1].bound_symbols if b.executor == "inductor"
    ]
    assert regions and all(r.impl.failure is None for r in regions)
