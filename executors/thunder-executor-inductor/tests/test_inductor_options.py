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
