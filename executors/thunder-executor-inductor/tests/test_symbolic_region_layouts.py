"""Symbolic Inductor regions given inputs with other strides than traced, or only ints."""

from __future__ import annotations

import warnings

import torch

import thunder_core


class _NormThenProject(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.project = torch.nn.RMSNorm(32), torch.nn.Linear(32, 64, bias=False)

    def forward(self, x):
        return self.project(self.norm(x))


def test_a_symbolic_region_that_only_views_an_input_checks_its_strides():
    """``loss = logits.sum()`` hands the backward an expanded gradient (all strides 0). The
    backward's region reshapes it for the weight's gradient and returns the view; Inductor's
    code asserts only the inputs its kernels read, and returned a view with the traced strides
    past the gradient's one-element storage (a crash). The region now checks such inputs and
    runs its operations with torch for other strides."""
    torch.manual_seed(0)
    model, reference = _NormThenProject(), _NormThenProject()
    reference.load_state_dict(model.state_dict())
    jfn = thunder_core.jit(model, executors=["inductor"], dynamic=True)
    for n in (8, 13):
        x = torch.randn(2, n, 32)
        jfn(x).sum().backward()
        reference(x).sum().backward()
        torch.testing.assert_close(model.project.weight.grad, reference.project.weight.grad)
        torch.testing.assert_close(model.norm.weight.grad, reference.norm.weight.grad)
    assert thunder_core.cache_info(jfn).entries == 1
    backward = str(thunder_core.last_backward_traces(jfn)[-1])
    assert "_inductor_fusion" in backward and "cpu f32[s0*s1, 64]" in backward, backward


def _attention_with_a_mask_of_length(q, k, v, n: int):
    positions = torch.arange(n)
    causal = positions[:, None] >= positions[None, :]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal)


def test_a_symbolic_region_whose_only_input_is_an_int_compiles_once(monkeypatch):
    """The mask's region takes nothing but ``n``, which the program finds equal to ``q``'s length
    (its ShapeEnv replaces ``n``'s symbol by the length's): traced in the trace's ShapeEnv with
    that symbol, it compiles once and runs every length, without a warning (it failed, "vr must
    not be None for symbol", and every length compiled again)."""
    monkeypatch.setenv("THUNDER_CORE_STRICT", "1")  # a region given back to torch is an error
    jfn = thunder_core.jit(_attention_with_a_mask_of_length, executors=["inductor"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for n in (5, 9, 7):
            q, k, v = (torch.randn(2, 3, n, 8) for _ in range(3))
            torch.testing.assert_close(jfn(q, k, v, n), _attention_with_a_mask_of_length(q, k, v, n))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 2, info.reasons  # the first length, then every other one
    assert "_inductor_fusion_1(n)" in str(thunder_core.last_traces(jfn)[-1])
