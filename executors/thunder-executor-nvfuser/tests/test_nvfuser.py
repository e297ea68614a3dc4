"""thunder-executor-nvfuser: probe, the prim-to-nvFuser recipe (pure logic), and GPU runs."""

from __future__ import annotations

import pytest
import torch
from thunder_executor_nvfuser import problems
from thunder_executor_nvfuser.translate import Ref, recipe

import thunder_core
from thunder_core.testing import plugin_info

PROBLEMS = problems()


def test_probe_reports_what_is_missing():
    info = plugin_info("nvfuser")
    if PROBLEMS:
        assert info.status == "unavailable" and info.reason == "; ".join(PROBLEMS)
        assert "nvfuser" in info.remedy
    else:
        assert info.status == "available"


def test_region_recipe_translates_prims_to_fusion_definition_calls():
    def fn(x, w):
        return torch.nn.functional.gelu(x * w).sum(-1)

    jfn = thunder_core.jit(fn, executors=[])
    x, w = torch.randn(4, 8), torch.randn(8)
    jfn(x, w)
    trace = thunder_core.last_traces(jfn)[0]
    steps = recipe(trace.bound_symbols, trace.inputs, [trace.output])
    ops = [op for _, op, _, _ in steps]
    assert ops[:2] == ["define_tensor", "define_tensor"]
    assert "broadcast_in_dim" in ops and "erf" in ops and "sum" in ops and ops[-1] == "outputs"
    defined = steps[1][3]
    assert defined == {"shape": [8], "contiguity": [True], "dtype": "Float"}
    assert steps[-1][2] == (Ref(trace.output.name),)


@pytest.mark.skipif(bool(PROBLEMS), reason="; ".join(PROBLEMS) or "available")
def test_fusions_match_eager_cuda_forward_and_backward():
    def fn(x, w):
        return (torch.nn.functional.gelu(x * w) * x).softmax(-1).sum()

    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    w = torch.randn(256, device="cuda", requires_grad=True)
    jfn = thunder_core.jit(fn, executors=["nvfuser"])
    actual = torch.autograd.grad(jfn(x, w), (x, w))
    expected = torch.autograd.grad(fn(x, w), (x, w))
    torch.testing.assert_close(actual, expected)
