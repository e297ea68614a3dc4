"""The IR: printed traces are valid Python that runs like the original."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import thunder_core
from thunder_core.ir.interpret import eval_trace


def block(x, w, b, scale: float):
    h = F.linear(x, w, b)
    h = F.gelu(h) * scale
    return h.softmax(-1), h.sum()


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)


def test_printed_trace_compiles_and_python_callable_matches_eager():
    x, w, b = _inputs()
    jfn = thunder_core.jit(block)
    jfn(x, w, b, 0.5)
    expected = block(x, w, b, 0.5)
    for trace in thunder_core.last_traces(jfn):
        source = trace.python()
        compile(source, "<trace>", "exec")  # valid Python
        actual = trace.python_callable()(x, w, b, 0.5)
        torch.testing.assert_close(actual, expected)


def test_printed_trace_names_inputs_shapes_dtypes_and_source_lines():
    x, w, b = _inputs()
    jfn = thunder_core.jit(block)
    jfn(x, w, b, 0.5)
    source = thunder_core.last_traces(jfn)[0].python()
    assert "def computation(x, w, b, scale):" in source
    assert '# x: "cpu f32[4, 8]"' in source
    assert "f32[4, 16]" in source
    assert "torch.nn.functional.linear(x, w, b)" in source
    assert "test_trace.py" in source and "h = F.linear(x, w, b)" in source
    assert "prims.matmul" in source  # the decomposition is shown under the op


def test_reference_evaluator_agrees_with_and_without_decompositions():
    x, w, b = _inputs()
    jfn = thunder_core.jit(block)
    jfn(x, w, b, 2.0)
    trace = thunder_core.last_traces(jfn)[0]
    expected = block(x, w, b, 2.0)
    torch.testing.assert_close(eval_trace(trace, x, w, b, 2.0), expected)
    torch.testing.assert_close(eval_trace(trace, x, w, b, 2.0, decompose=True), expected)


def test_last_traces_have_provenance_and_timing():
    x, w, b = _inputs()
    jfn = thunder_core.jit(block)
    jfn(x, w, b, 1.0)
    traces = thunder_core.last_traces(jfn)
    names = [t.provenance.pass_name for t in traces]
    assert names[0] == "capture" and "dce" in names and names[-1] == "delete_last_used"
    assert traces[0].provenance.seconds > 0
    assert "Constructed by capture (took" in traces[0].python()
    assert "del " in traces[-1].python()  # intermediates are freed after their last use


def test_dead_code_is_removed():
    def fn(x):
        unused = x.exp()  # noqa: F841
        return x + 1

    jfn = thunder_core.jit(fn)
    jfn(torch.randn(3))
    traces = thunder_core.last_traces(jfn)
    assert "torch.exp" in traces[0].python()
    assert "torch.exp" not in traces[-1].python()


def test_generated_names_never_shadow_globals():
    def fn(torch_, prims, t0):  # argument names that collide with generated names
        return torch_ * prims + t0

    jfn = thunder_core.jit(fn)
    args = [torch.randn(2) for _ in range(3)]
    torch.testing.assert_close(jfn(*args), fn(*args))
    assert "def computation(torch_, prims_, t0_1):" in thunder_core.last_traces(jfn)[0].python()


def test_an_int_enum_member_in_a_trace_is_passed_as_itself():
    import enum

    class Factor(enum.IntEnum):
        K = 2

    def f(x):
        return x * Factor.K + Factor.K

    x = torch.randn(4)
    torch.testing.assert_close(thunder_core.jit(f)(x), f(x))
