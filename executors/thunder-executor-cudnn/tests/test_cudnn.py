"""thunder-executor-cudnn: probe, checker logic on proxies, and (on a GPU) results against eager CUDA."""

from __future__ import annotations

import pytest
import torch
from thunder_executor_cudnn import problems
from thunder_executor_cudnn.checks import sdpa_checker, sdpa_stats_arguments

import thunder_core
from thunder_core.extend import TensorProxy
from thunder_core.testing import check_probe_against_machine, plugin_info

PROBLEMS = problems()


def proxy(name, shape, dtype=torch.bfloat16, device="cuda"):
    return TensorProxy(name, shape, dtype, device)


def test_probe_states_every_missing_requirement_and_the_remedy(monkeypatch):
    monkeypatch.delenv("THUNDER_CORE_NO_AUTOLOAD", raising=False)  # the default selection, as users get it
    info = plugin_info("cudnn")
    if not PROBLEMS:
        assert info.status == "available"
        return
    assert info.status == "unavailable"
    assert info.reason == "; ".join(PROBLEMS)
    assert "pip install 'thunder-executor-cudnn[cudnn]'" in info.remedy and "8.0+" in info.remedy
    # jit is unaffected: the executor is left out with its reason
    jfn = thunder_core.jit(lambda a: a * 2)
    torch.testing.assert_close(jfn(torch.ones(2)), torch.full((2,), 2.0))
    assert thunder_core.explain(jfn).not_used["cudnn"].startswith("unavailable: ")


@pytest.mark.parametrize(
    "case, reason",
    [
        (dict(dtype=torch.float32), "float16 or bfloat16"),
        (dict(head_dim=20), "multiple of 8"),
        (dict(head_dim=192), "up to 128"),
        (dict(capability=(7, 5)), "compute capability 8.0+"),
        (dict(device="cpu"), "CUDA tensors"),
        (dict(kv_heads=2), "as many key/value heads"),
        (dict(mask=True), "not an explicit attn_mask"),
        (dict(dropout=0.1), "dropout"),
    ],
)
def test_checker_rejects_with_the_limit_it_hits(case, reason):
    head_dim = case.get("head_dim", 64)
    device, dtype = case.get("device", "cuda"), case.get("dtype", torch.bfloat16)
    q = proxy("q", (2, 4, 128, head_dim), dtype, device)
    kv = (2, case.get("kv_heads", 4), 128, head_dim)
    k, v = proxy("k", kv, dtype, device), proxy("v", kv, dtype, device)
    mask = proxy("m", (128, 128), torch.bool, device) if case.get("mask") else None
    verdict = sdpa_checker(case.get("capability", (8, 0)))(q, k, v, mask, case.get("dropout", 0.0), True)
    assert verdict is not True and reason in str(verdict)


def test_checker_accepts_supported_calls_and_hopper_head_dims():
    q, k, v = (proxy(n, (2, 8, 256, 64)) for n in "qkv")
    assert sdpa_checker((8, 0))(q, k, v, None, 0.0, True) is True
    big = [proxy(n, (1, 2, 64, 256), torch.float16) for n in "qkv"]
    assert sdpa_checker((9, 0))(*big) is True
    assert sdpa_checker((8, 6))(*big) is not True


@pytest.mark.skipif(bool(PROBLEMS), reason="; ".join(PROBLEMS) or "available")
def test_forward_and_backward_match_eager_cuda():
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )

    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    jfn = thunder_core.jit(attention, executors=["cudnn"])
    out = jfn(q, k, v)
    expected = attention(q, k, v)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    expected_grads = torch.autograd.grad(expected, (q, k, v), g)
    torch.testing.assert_close(grads, expected_grads, atol=5e-2, rtol=5e-2)
    assert thunder_core.explain(jfn).for_symbol("cudnn_sdpa_forward")[0].executor == "cudnn"


def test_a_gradient_in_another_layout_is_copied_into_the_outputs_layout():
    from thunder_executor_cudnn.checks import in_layout_of

    out = torch.randn(2, 8, 4, 16).transpose(1, 2)  # (b, h, s, d) with a transposed layout, as q often is
    grad = torch.randn(out.shape)  # contiguous: another layout than out's
    fixed = in_layout_of(grad, out)
    assert fixed.stride() == out.stride()
    torch.testing.assert_close(fixed, grad)
    assert in_layout_of(out, out) is out


def test_the_statistics_switch_follows_the_installed_frontend():
    # cudnn-frontend 1.13 replaced is_inference with generate_stats, which means the opposite.
    assert sdpa_stats_arguments("1.12.1", training=True) == {"is_inference": False}
    assert sdpa_stats_arguments("1.12.1", training=False) == {"is_inference": True}
    assert sdpa_stats_arguments("1.13.0", training=True) == {"generate_stats": True}
    assert sdpa_stats_arguments("1.16.0", training=False) == {"generate_stats": False}


def test_probe_agrees_with_an_independent_look_at_this_machine():
    check_probe_against_machine("cudnn", ["cudnn"], "nvidia-cudnn-frontend is not installed")


def _frontend_problem() -> str | None:
    import importlib.util

    if importlib.util.find_spec("cudnn") is None:
        return "nvidia-cudnn-frontend is not installed (nox -s gpu-host-checks installs it with a CUDA build of torch)"
    try:
        import cudnn  # noqa: F401 - loads the cuDNN library
    except Exception as error:  # noqa: BLE001 - a CPU-only torch has no cuDNN library to load
        return f"the cuDNN library does not load here: {error}"
    return None


@pytest.mark.skipif(_frontend_problem() is not None, reason=str(_frontend_problem()))
@pytest.mark.parametrize("training", [True, False])
def test_graphs_are_described_and_validated_by_the_installed_frontend_without_a_device(training):
    """Every call our graphs make (tensor, sdpa with its statistics switch, sdpa_backward, outputs)
    is accepted by the installed cudnn-frontend; plans need a device and are not built here."""
    from thunder_executor_cudnn._impl import describe_backward, describe_forward

    shape = (2, 4, 128, 64)
    contiguous = (shape, (4 * 128 * 64, 128 * 64, 64, 1))
    transposed = (shape, (128 * 4 * 64, 64, 4 * 64, 1))  # (batch, seq, heads, dim) viewed as BHSD
    for q, k, v in ((contiguous,) * 3, (transposed,) * 3):
        graph, *_ = describe_forward(q, k, v, torch.bfloat16, 0.125, True, training)
        graph.validate()
        if training:
            graph, *_ = describe_backward(q, k, v, torch.bfloat16, 0.125, True)
            graph.validate()
