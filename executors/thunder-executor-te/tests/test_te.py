"""thunder-executor-te: probe, checker logic on proxies, and GPU runs."""

from __future__ import annotations

import pytest
import torch
from thunder_executor_te import problems
from thunder_executor_te.checks import linear_checker

import thunder_core
from thunder_core.extend import TensorProxy
from thunder_core.testing import check_probe_against_machine, plugin_info

PROBLEMS = problems()


def test_probe_reports_what_is_missing():
    info = plugin_info("te")
    if PROBLEMS:
        assert info.status == "unavailable" and info.reason == "; ".join(PROBLEMS)
        assert "8.9+ for FP8" in info.remedy
    else:
        assert info.status == "available"


def proxy(shape, dtype=torch.bfloat16, device="cuda"):
    return TensorProxy("t", shape, dtype, device)


def test_checker_states_te_limits():
    x, w = proxy((4, 128, 256)), proxy((512, 256))
    assert linear_checker((9, 0), fp8=True)(x, w) is True
    assert "compute capability 8.9+" in str(linear_checker((8, 0), fp8=True)(x, w))
    assert linear_checker((8, 0), fp8=False)(x, w) is True
    assert "divisible by 16" in str(linear_checker((9, 0), fp8=True)(x, proxy((500, 256))))
    assert "flattened batch divisible by 8" in str(linear_checker((9, 0), fp8=True)(proxy((3, 5, 256)), w))
    assert "CUDA tensors" in str(linear_checker((9, 0), fp8=True)(proxy((8, 256), device="cpu"), w))


@pytest.mark.skipif(bool(PROBLEMS), reason="; ".join(PROBLEMS) or "available")
def test_linear_matches_eager_cuda_within_fp8_tolerance():
    torch.manual_seed(0)
    x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    jfn = thunder_core.jit(lambda x, w: torch.nn.functional.linear(x, w), executors=["te"])
    out = jfn(x, w)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w), atol=0.5, rtol=0.1)
    out.sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape
    assert thunder_core.explain(jfn).for_symbol("torch.nn.functional.linear")[0].executor == "te"


def test_probe_agrees_with_an_independent_look_at_this_machine():
    check_probe_against_machine("te", ["transformer_engine"], "transformer_engine is not installed")


FP8_PROBLEMS = [
    p for p in __import__("thunder_executor_te.fp8_plugin", fromlist=["problems"]).problems() if p
]


def test_the_fp8_plugin_is_unavailable_with_the_reason_where_te_or_the_gpu_is_missing():
    info = plugin_info("fp8")
    if FP8_PROBLEMS:
        assert info.status == "unavailable" and info.reason == "; ".join(FP8_PROBLEMS)
        assert "8.9+" in info.remedy
        with pytest.raises(thunder_core.PluginError, match="fp8"):
            thunder_core.jit(lambda x: x * 2, plugins=["fp8"])
    else:
        assert info.status == "available"


def test_fp8_recipe_options_are_checked_without_transformer_engine():
    from thunder_executor_te.recipe import recipe_from

    assert dict(recipe_from({})) == {
        "format": "hybrid",
        "amax_history_len": 16,
        "amax_compute_algo": "max",
        "margin": 0,
    }
    assert dict(recipe_from({"format": "e4m3", "margin": 1}))["format"] == "e4m3"
    with pytest.raises(thunder_core.ConfigError, match="format must be one of"):
        recipe_from({"format": "e5m2"})
    with pytest.raises(thunder_core.ConfigError, match="amax_compute_algo must be one of"):
        recipe_from({"amax_compute_algo": "mean"})


@pytest.mark.skipif(bool(FP8_PROBLEMS), reason="fp8 is unavailable: " + "; ".join(FP8_PROBLEMS))
def test_fp8_plugin_claims_linear_with_its_recipe():
    torch.manual_seed(0)
    x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    jfn = thunder_core.jit(
        lambda x, w: torch.nn.functional.linear(x, w), plugins=["fp8"], options={"fp8": {"format": "e4m3"}}
    )
    torch.testing.assert_close(jfn(x, w), torch.nn.functional.linear(x, w), atol=0.5, rtol=0.1)
    assert thunder_core.explain(jfn).for_symbol("torch.nn.functional.linear")[0].executor == "te_fp8"
