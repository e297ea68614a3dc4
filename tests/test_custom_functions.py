"""``torch.autograd.Function`` subclasses and reentrant checkpointing inside jitted code.

A custom Function is recorded whole and differentiated by PyTorch autograd with the user's own
``backward``. Its forward may read tensors it is not given (a module's parameter, as
``checkpoint(lambda t: layer(t), x, use_reentrant=True)`` does), and a reentrant checkpoint's
backward refuses ``torch.autograd.grad``: both train as in eager.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import thunder_core


class _Doubled(torch.autograd.Function):
    """Reads the layer's weight itself; its backward gives the input's gradient only."""

    layer: nn.Linear

    @staticmethod
    def forward(ctx, x):
        with torch.no_grad():
            return _Doubled.layer(x) * 2

    @staticmethod
    def backward(ctx, grad):
        return grad @ _Doubled.layer.weight * 2


class _UsesAFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        _Doubled.layer = self.lin  # this module's layer: while it is captured, its weight is a proxy
        return _Doubled.apply(x) + self.lin(x)


class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.a, self.b, self.reentrant = nn.Linear(8, 16), nn.Linear(16, 4), reentrant

    def forward(self, x):
        h = checkpoint(lambda t: F.gelu(self.a(t)), x, use_reentrant=self.reentrant)
        return self.b(h)


def _trains_as_eager(model: nn.Module, x: torch.Tensor) -> None:
    jitted_copy = copy.deepcopy(model)
    jmodel = thunder_core.jit(jitted_copy)
    for m, inp in ((model, x), (jmodel, x.detach().clone().requires_grad_())):
        for _ in range(2):  # gradients accumulate over two calls, from the compiled program too
            m(inp).square().sum().backward()
    torch.testing.assert_close(jmodel(x), model(x))
    for (name, p), q in zip(model.named_parameters(), jitted_copy.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_a_custom_function_reading_a_module_parameter_trains_as_eager():
    # its forward met the parameter as a proxy while the module was captured
    torch.manual_seed(0)
    _trains_as_eager(_UsesAFunction(), torch.randn(2, 4, requires_grad=True))


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_inside_a_module_trains_as_eager(reentrant):
    torch.manual_seed(0)
    _trains_as_eager(_Checkpointed(reentrant), torch.randn(3, 8, requires_grad=True))


def test_a_reentrant_checkpoint_in_a_jitted_function_gives_the_inputs_gradient():
    # PyTorch autograd ran the backward with .grad(), which a reentrant checkpoint refuses
    def f(x):
        return checkpoint(lambda h: torch.sin(h) * 2, x, use_reentrant=True)

    x = torch.randn(8, requires_grad=True)
    f(x).sum().backward()  # .backward(): eager refuses .grad() here too
    expected, x.grad = x.grad, None
    thunder_core.jit(f)(x).sum().backward()
    torch.testing.assert_close(x.grad, expected)


def test_a_checkpointed_batch_norm_updates_its_statistics_once_per_call():
    # the metadata runs of the checkpointed forward updated the real running statistics too
    torch.manual_seed(0)
    lin, norm = nn.Linear(4, 4), nn.BatchNorm1d(4)

    def f(x):
        return checkpoint(lambda t: norm(lin(t)), x, use_reentrant=True)

    x = torch.randn(8, 4, requires_grad=True)
    f(x).sum().backward()
    expected = (norm.num_batches_tracked.clone(), norm.running_mean.clone())
    norm.reset_running_stats()
    thunder_core.jit(f)(x).sum().backward()
    assert norm.num_batches_tracked == expected[0] == 2  # the forward, then its recomputation
    torch.testing.assert_close(norm.running_mean, expected[1])
