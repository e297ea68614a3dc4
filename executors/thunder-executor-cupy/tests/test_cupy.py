"""thunder-executor-cupy: probe, kernel generation and checkers (pure logic), and GPU runs."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch
from thunder_executor_cupy import problems
from thunder_executor_cupy.codegen import (
    Unsupported,
    broadcast_views,
    elementwise_kernel_spec,
    softmax_checker,
)

import thunder_core
from thunder_core.extend import TensorProxy
from thunder_core.testing import check_probe_against_machine, plugin_info

PROBLEMS = problems()


def test_probe_reports_what_is_missing():
    info = plugin_info("cupy")
    if PROBLEMS:
        assert info.status == "unavailable" and info.reason == "; ".join(PROBLEMS)
        assert "pip install 'thunder-executor-cupy[cuda12]'" in info.remedy
    else:
        assert info.status == "available"


def _region(fn, *args):
    jfn = thunder_core.jit(fn, executors=[])
    jfn(*args)
    trace = thunder_core.last_traces(jfn)[0]
    outputs = [p for p in trace.output] if isinstance(trace.output, tuple) else [trace.output]
    return trace.bound_symbols, trace.inputs, outputs


def test_elementwise_regions_become_one_cuda_c_body():
    x, w = torch.randn(16), torch.randn(16)
    in_params, out_params, body = elementwise_kernel_spec(
        *_region(lambda x, w: torch.sigmoid(x * w + 1.0), x, w)
    )
    assert in_params == "float32 in0, float32 in1" and out_params == "float32 out0"
    assert "(in0 * in1)" in body and "exp(-" in body and body.strip().endswith(";")
    assert body.count("out0 =") == 1


def test_shapes_that_do_not_match_are_refused():
    with pytest.raises(Unsupported, match="shape"):
        elementwise_kernel_spec(*_region(lambda x: x.sum(0) + 1, torch.randn(4, 4)))


def test_inputs_the_region_broadcasts_are_viewed_for_numpy_style_broadcasting():
    x, bias, scale = torch.randn(4, 8), torch.randn(8), torch.randn(4, 1)
    region = _region(lambda x, b, s: torch.tanh(x + b) * s, x, bias, scale)
    views = broadcast_views(*region)
    assert views == [None, (1, 8), (4, 1)]
    elementwise_kernel_spec(*region)  # accepted
    # What CuPy computes from the views (NumPy broadcasting) is what the trace computes.
    viewed = [t if v is None else t.view(v) for t, v in zip((x, bias, scale), views)]
    torch.testing.assert_close(torch.tanh(viewed[0] + viewed[1]) * viewed[2], torch.tanh(x + bias) * scale)


def test_an_input_used_at_its_own_shape_too_is_refused():
    with pytest.raises(Unsupported, match="shape"):
        elementwise_kernel_spec(*_region(lambda x, b: (x + b, b * 2), torch.randn(4, 8), torch.randn(8)))


def test_softmax_checker_on_proxies():
    x = TensorProxy("x", (8, 128), torch.float32, "cuda")
    assert softmax_checker(x, -1) is True
    assert "last dim" in str(softmax_checker(x, 0))
    assert "float32 CUDA" in str(softmax_checker(TensorProxy("y", (8, 128), torch.float16, "cuda"), -1))


@pytest.mark.skipif(bool(PROBLEMS), reason="; ".join(PROBLEMS) or "available")
def test_fused_regions_and_softmax_match_eager_cuda():
    def fn(x, w):
        return (torch.nn.functional.gelu(x * w) + x).softmax(-1)

    x, w = torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda")
    jfn = thunder_core.jit(fn, executors=["cupy"])  # the entry point registers both executors
    torch.testing.assert_close(jfn(x, w), fn(x, w))
    ran = {r.executor for r in thunder_core.explain(jfn).operations}
    assert {"cupy", "cupy_softmax"} <= ran, str(thunder_core.explain(jfn))


def test_scalar_inputs_are_renamed_as_whole_identifiers():
    # 12 inputs, the second a one-element tensor: in1 -> in1[0] must leave in10 and in11 alone.
    def fn(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out * x
        return out

    xs = [torch.randn(4, 4) for _ in range(12)]
    xs[1] = torch.randn(1, 1)  # broadcast inside: a one-element input read as in1[0]
    in_params, _, body = elementwise_kernel_spec(*_region(fn, *xs))
    assert "in1[0]" in body and "in10" in body and "in11" in body
    assert "in1[0]0" not in body and "in1[0]1" not in body
    assert in_params.count("raw") == 1


def test_sources_need_no_math_header():
    # NVRTC includes no headers: INFINITY / CUDART_* constants do not compile there.
    from thunder_executor_cupy.codegen import SOFTMAX_SOURCE, _literal

    for text in (SOFTMAX_SOURCE, _literal(float("inf")), _literal(float("-inf")), _literal(float("nan"))):
        assert "INFINITY" not in text and "CUDART_" not in text


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_raw_kernel_source_compiles_with_nvcc(tmp_path, arch):
    from thunder_executor_cupy.codegen import SOFTMAX_SOURCE

    source = tmp_path / "softmax.cu"
    source.write_text(SOFTMAX_SOURCE)
    done = subprocess.run(
        ["nvcc", "-c", f"-arch={arch}", "-o", str(tmp_path / "softmax.o"), str(source)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_probe_agrees_with_an_independent_look_at_this_machine():
    check_probe_against_machine("cupy", ["cupy"], "CuPy is not installed")
