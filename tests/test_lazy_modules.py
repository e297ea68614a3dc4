"""Lazy modules (``nn.LazyLinear``, ``nn.LazyConv2d``): the first call initializes the
parameters from the input, as eagerly, and its result equals eager's; later calls are compiled,
forward and backward, through jit and torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import thunder_core

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]
FRONT_ENDS = ["jit-torch", "jit-default", "torch.compile"]


def compiled(module, front_end):
    if front_end == "torch.compile":
        torch._dynamo.reset()
        return torch.compile(module, backend="thunder_core")
    return thunder_core.jit(module, executors=["torch"] if front_end == "jit-torch" else DEFAULT_EXECUTORS)


class LazyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.LazyConv2d(4, 3)
        self.norm = nn.LazyBatchNorm2d()
        self.head = nn.LazyLinear(5)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_lazy_modules_initialize_on_the_first_call_then_compile(front_end):
    model, reference = LazyNet(), LazyNet()
    cmodel = compiled(model, front_end)
    x = torch.randn(2, 3, 6, 6)
    torch.manual_seed(0)
    expected = reference(x)
    torch.manual_seed(0)
    actual = cmodel(x)  # initializes the parameters, drawing the same numbers
    torch.testing.assert_close(actual, expected)
    for _ in range(3):
        x = torch.randn(2, 3, 6, 6)
        expected, actual = reference(x), cmodel(x)
        torch.testing.assert_close(actual, expected)
        expected.square().sum().backward()
        actual.square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    if front_end != "torch.compile":
        assert thunder_core.cache_info(cmodel).entries >= 1  # the calls after the first were compiled
    assert all(type(p) is nn.Parameter for p in model.parameters())
