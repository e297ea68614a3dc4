"""Differentiating a gradient (``create_graph=True``) through a jitted function: the compiled
backward is not differentiable again, so it is refused with a clear error the moment it is asked
for, never a silently wrong second-order gradient. Programs PyTorch autograd records whole (the
autograd fallback) are differentiable twice and give eager's gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core.jit.autograd import NotTwiceDifferentiable

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def gradient_penalty_step(model, x):
    out = model(x)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    return out.sum() + (gx**2).sum()


@pytest.mark.parametrize("executors", [["torch"], DEFAULT_EXECUTORS], ids=["torch", "default"])
def test_a_gradient_penalty_through_jit_is_refused_clearly(executors):
    model = make_model()
    jmodel = thunder_core.jit(model, executors=executors)
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(NotTwiceDifferentiable, match="create_graph=True"):
        gradient_penalty_step(jmodel, x)
    # First-order training still works afterwards, with eager's gradients.
    jmodel(x).sum().backward()
    reference = make_model()
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_backward_create_graph_is_refused():
    jmodel = thunder_core.jit(make_model())
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(NotTwiceDifferentiable, match="not differentiable again"):
        jmodel(x).sum().backward(create_graph=True)


def test_through_torch_compile_the_penalty_is_refused():
    torch._dynamo.reset()
    compiled = torch.compile(make_model(), backend="thunder_core")
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(NotTwiceDifferentiable):
        gradient_penalty_step(compiled, x)


def with_inplace(x, w):
    y = x @ w
    y.mul_(2)  # an in-place op on a value that needs a gradient: PyTorch autograd records the program
    return torch.tanh(y)


def test_a_program_autograd_records_whole_is_twice_differentiable():
    torch.manual_seed(0)
    w = torch.randn(3, 2, requires_grad=True)
    x = torch.randn(4, 3, requires_grad=True)
    jfn = thunder_core.jit(with_inplace)
    results = []
    for fn in (with_inplace, jfn):
        out = fn(x, w)
        (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        results.append(torch.autograd.grad((gx**2).sum(), w))
    torch.testing.assert_close(results[1], results[0])
    assert any("PyTorch autograd records" in note for note in jfn.last_compiled().notes)
