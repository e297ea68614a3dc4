"""thunder-executor-nvfuser: probe, the prim-to-nvFuser recipe (pure logic), and GPU runs."""

from __future__ import annotations

import pytest
import torch
from thunder_executor_nvfuser import problems
from thunder_executor_nvfuser.translate import Ref, recipe, recipe_key, tensor_descriptor, untranslatable

import thunder_core
from thunder_core.testing import check_probe_against_machine, plugin_info

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
    assert defined == {"shape": [8], "contiguity": [True], "dtype": "Float", "stride_order": [0]}
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
    ran = [r.executor for r in thunder_core.explain(jfn).operations]
    assert "nvfuser" in ran, ran  # its regions ran, not only torch


def _trace(fn, *args):
    jfn = thunder_core.jit(fn, executors=[])
    jfn(*args)
    return thunder_core.last_traces(jfn)[0]


def test_python_numbers_become_define_scalar_handles():
    trace = _trace(lambda x: x * 2.5 + 1, torch.randn(4))
    steps = recipe(trace.bound_symbols, trace.inputs, [trace.output])
    scalars = [s for s in steps if s[1] == "define_scalar"]
    assert [(s[2], s[3]["dtype"]) for s in scalars] == [((2.5,), "Double"), ((1,), "Int")]
    for _, op, args, _ in steps:
        if op in ("mul", "add"):
            assert all(isinstance(a, Ref) for a in args), (op, args)


def test_contiguity_and_stride_order_follow_nvfusers_rule():
    # Independent expectations, written from nvFuser's description: None exactly for broadcast dims;
    # stride_order[i] is the rank of dim i's stride (0 = smallest).
    assert tensor_descriptor((4, 8), (8, 1)) == ([True, True], [1, 0])
    assert tensor_descriptor((4, 1, 8), (8, 8, 1)) == ([True, None, True], [2, 1, 0])
    assert tensor_descriptor((4, 8), (1, 4)) == ([True, True], [0, 1])  # a transposed tensor
    assert tensor_descriptor((4, 8), (16, 1)) == ([False, True], [1, 0])  # a slice of wider rows
    assert tensor_descriptor((4, 8), (0, 1)) == ([None, True], [0, 1])  # an expanded dim


def test_the_fusion_cache_key_keeps_the_wiring():
    a = ("a", "define_tensor", (), {"shape": [4]})
    first = [a, ("t1", "exp", (Ref("a"),), {}), ("t2", "log", (Ref("a"),), {}),
             ("t3", "sub", (Ref("t1"), Ref("t2")), {}), (None, "outputs", (Ref("t3"),), {})]  # fmt: skip
    swapped = [a, ("t2", "exp", (Ref("a"),), {}), ("t1", "log", (Ref("a"),), {}),
               ("t3", "sub", (Ref("t1"), Ref("t2")), {}), (None, "outputs", (Ref("t3"),), {})]  # fmt: skip
    renamed = [(r and r.upper(), op, tuple(Ref(x.name.upper()) if isinstance(x, Ref) else x for x in args), kw)
               for r, op, args, kw in first]  # fmt: skip
    assert recipe_key(first) != recipe_key(swapped)  # exp - log is not log - exp
    assert recipe_key(first) == recipe_key(renamed)  # names alone do not matter


def test_the_checker_claims_only_what_translates():
    trace = _trace(lambda x: torch.cumsum(x, 0), torch.randn(4))
    (bsym,) = [b for b in trace.bound_symbols if "cumsum" in b.symbol.name]
    assert untranslatable(bsym)  # its prims have no translation here
    good = _trace(lambda x: x.exp() * 2, torch.randn(4))
    assert all(untranslatable(b) is None for b in good.bound_symbols)


def test_probe_agrees_with_an_independent_look_at_this_machine():
    check_probe_against_machine("nvfuser", ["nvfuser", "nvfuser_direct"], "nvFuser is not installed")
