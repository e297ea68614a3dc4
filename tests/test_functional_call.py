"""``torch.func.functional_call`` on a jitted module uses the given parameters and buffers (top
level and nested, all or some, before and after the first call), gradients flow to them as in
eager, and the module's own tensors are back afterwards; attributes set on the jitted module
reach the original module."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

import thunder_core

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.register_buffer("scale", torch.ones(4))
        self.gain = nn.Parameter(torch.full((4,), 0.5))

    def forward(self, x):
        return torch.tanh(self.fc(x)) * self.scale + self.gain


def replacements():
    return {
        "nested parameter": {"fc.weight": torch.randn(4, 3)},
        "top-level buffer": {"scale": torch.full((4,), 3.0)},
        "top-level parameter": {"gain": torch.full((4,), -1.0)},
        "everything": {
            "fc.weight": torch.randn(4, 3),
            "fc.bias": torch.randn(4),
            "scale": torch.randn(4),
            "gain": torch.randn(4),
        },
    }


@pytest.mark.parametrize("executors", [["torch"], DEFAULT_EXECUTORS], ids=["torch", "default"])
@pytest.mark.parametrize("called_first", [False, True], ids=["fresh", "after a call"])
@pytest.mark.parametrize("which", list(replacements()))
def test_functional_call_uses_the_given_tensors(which, called_first, executors):
    torch.manual_seed(0)
    model = Net()
    jmodel = thunder_core.jit(model, executors=executors)
    x = torch.randn(5, 3)
    if called_first:
        jmodel(x)
    given = {k: v.requires_grad_() for k, v in replacements()[which].items()}
    expected = functional_call(model, given, (x,))
    expected_grads = torch.autograd.grad(expected.square().sum(), list(given.values()))
    actual = functional_call(jmodel, given, (x,))
    actual_grads = torch.autograd.grad(actual.square().sum(), list(given.values()))
    torch.testing.assert_close(actual, expected)
    for a, e in zip(actual_grads, expected_grads):
        torch.testing.assert_close(a, e)
    torch.testing.assert_close(jmodel(x), model(x))  # the module's own tensors are back
    assert isinstance(model.gain, nn.Parameter)


def test_inner_loop_adaptation_through_functional_call():
    """A MAML-style inner step: parameters after one gradient step, used functionally."""
    torch.manual_seed(0)
    model = Net()
    jmodel = thunder_core.jit(model)
    x, y = torch.randn(6, 3), torch.randn(6, 4)
    results = []
    for m in (model, jmodel):
        params = dict(model.named_parameters())
        loss = (functional_call(m, params, (x,)) - y).square().mean()
        grads = torch.autograd.grad(loss, list(params.values()))
        adapted = {k: p - 0.1 * g for (k, p), g in zip(params.items(), grads)}
        outer = (functional_call(m, adapted, (x,)) - y).square().mean()
        results.append(torch.autograd.grad(outer, list(params.values())))
    for a, e in zip(results[1], results[0]):
        torch.testing.assert_close(a, e)


def test_attributes_set_on_the_jitted_module_reach_the_original():
    model = Net()
    jmodel = thunder_core.jit(model)
    x = torch.randn(2, 3)
    jmodel(x)
    jmodel.scale = torch.full((4,), 7.0)  # replaces the registered buffer, as on the original
    assert model.scale is jmodel.scale
    torch.testing.assert_close(jmodel(x), model(x))
