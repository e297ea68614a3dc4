"""thunder-executor-apex: the probe tells NVIDIA Apex from PyPI's apex; checkers on proxies; GPU runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from thunder_executor_apex import problems
from thunder_executor_apex.checks import cross_entropy_checker, norm_checker

from thunder_core.extend import TensorProxy
from thunder_core.testing import check_probe_against_machine, plugin_info

PROBLEMS = problems()


def test_probe_reports_what_is_missing():
    info = plugin_info("apex")
    if PROBLEMS:
        assert info.status == "unavailable" and info.reason == "; ".join(PROBLEMS)
        assert "NVIDIA/apex" in info.remedy
    else:
        assert info.status == "available"


def test_probe_tells_the_unrelated_pypi_apex_from_nvidia_apex(tmp_path):
    # A package named apex without NVIDIA's subpackages, as the PyPI project of that name is.
    (tmp_path / "apex").mkdir()
    (tmp_path / "apex" / "__init__.py").write_text("'''Apex: an unrelated web framework.'''\n")
    code = textwrap.dedent(
        """
        import thunder_executor_apex as a
        print(a.apex_problem())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])), "PATH": ""},
    )  # fmt: skip
    assert "the installed 'apex' is not NVIDIA Apex" in done.stdout
    assert "no apex.normalization" in done.stdout


def proxy(shape, dtype=torch.float16, device="cuda"):
    return TensorProxy("x", shape, dtype, device)


def test_cross_entropy_checker_states_its_limits():
    logits, target = proxy((8, 100)), proxy((8,), torch.int64)
    assert cross_entropy_checker(True)(logits, target) is True
    assert "--xentropy" in str(cross_entropy_checker(False)(logits, target))
    assert "CUDA logits" in str(cross_entropy_checker(True)(proxy((8, 100), device="cpu"), target))
    assert "(N, C) logits" in str(cross_entropy_checker(True)(proxy((2, 8, 100)), target))
    assert "class weights" in str(cross_entropy_checker(True)(logits, target, proxy((100,))))


def test_norm_checker_states_its_limits():
    x, w = proxy((4, 16, 64)), proxy((64,))
    assert norm_checker("RMSNorm")(x, (64,), w) is True
    assert "trailing dims" in str(norm_checker("RMSNorm")(x, (32,), w))
    assert "CUDA tensors" in str(norm_checker("LayerNorm")(proxy((4, 64), torch.int64), (64,)))


def test_norm_checker_refuses_a_weight_of_another_dtype():
    # The non-mixed fused functions need the weight in the input's dtype (a float32 weight with a
    # bfloat16 input is what mixed_dtype_fused_* are for).
    x = proxy((4, 64), torch.bfloat16)
    assert "input's dtype" in str(norm_checker("RMSNorm")(x, (64,), proxy((64,), torch.float32)))
    assert "input's dtype" in str(
        norm_checker("LayerNorm")(x, (64,), proxy((64,), torch.bfloat16), proxy((64,), torch.float32))
    )
    assert (
        norm_checker("LayerNorm")(x, (64,), proxy((64,), torch.bfloat16), proxy((64,), torch.bfloat16))
        is True
    )


def test_xentropy_needs_its_compiled_extension():
    from thunder_executor_apex.checks import xentropy_available

    python_only = {"apex.contrib.xentropy"}
    assert not xentropy_available(lambda name: name in python_only)
    assert xentropy_available(lambda name: name in python_only | {"xentropy_cuda"})


@pytest.mark.skipif(bool(PROBLEMS), reason="; ".join(PROBLEMS) or "available")
def test_fused_kernels_match_eager_cuda():
    import thunder_core

    torch.manual_seed(0)
    x = torch.randn(32, 256, device="cuda", requires_grad=True)
    w = torch.randn(256, device="cuda", requires_grad=True)
    target = torch.randint(0, 256, (32,), device="cuda")

    def loss(x, w):
        return torch.nn.functional.cross_entropy(torch.nn.functional.rms_norm(x, (256,), w), target)

    jfn = thunder_core.jit(loss, executors=["apex"])
    actual = torch.autograd.grad(jfn(x, w), (x, w))
    expected = torch.autograd.grad(loss(x, w), (x, w))
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    ran = {r.operation.split("(")[0]: r.executor for r in thunder_core.explain(jfn).operations}
    assert ran.get("torch.nn.functional.rms_norm") == "apex", ran
    assert ran.get("torch.nn.functional.cross_entropy") == "apex", ran


def test_probe_agrees_with_an_independent_look_at_this_machine():
    check_probe_against_machine("apex", ["apex"], "NVIDIA Apex is not installed")
