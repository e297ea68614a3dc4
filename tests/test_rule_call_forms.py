"""Call forms a gradient rule does not cover go through the decomposition or PyTorch's autograd,
decided when the rule is applied: training through them gives eager's results and gradients
(they raised an empty ``NoRule`` while the backward was built)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import thunder_core


def _train_like_eager(module: torch.nn.Module, *inputs, steps: int = 2):
    reference, compiled = copy.deepcopy(module), copy.deepcopy(module)
    jmodule = thunder_core.jit(compiled)
    for _ in range(steps):
        want = reference(*inputs)
        got = jmodule(*inputs)
        torch.testing.assert_close(got, want)
        (want * want.detach().sum()).sum().backward()
        (got * got.detach().sum()).sum().backward()
        for (name, p), q in zip(reference.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(q, p, msg=name)
            torch.testing.assert_close(q.grad.to_dense(), p.grad.to_dense(), msg=name)


@pytest.mark.parametrize("sparse", [False, True])
def test_an_embedding_with_max_norm_renormalizes_its_rows_and_trains_as_eager(sparse):
    torch.manual_seed(0)
    module = torch.nn.Embedding(10, 4, max_norm=1.0, sparse=sparse)
    _train_like_eager(module, torch.tensor([[0, 1, 2], [3, 0, 9]]))


@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_a_sparse_embedding_gets_a_sparse_gradient_as_in_eager(max_norm):
    # its decomposition's gradient was dense, and torch.optim.SparseAdam refused it
    torch.manual_seed(0)
    module = torch.nn.Embedding(10, 4, max_norm=max_norm, sparse=True)
    jitted_copy = copy.deepcopy(module)
    optimizer = torch.optim.SparseAdam(jitted_copy.parameters(), lr=0.1)
    thunder_core.jit(jitted_copy)(torch.tensor([[0, 1, 2], [3, 0, 9]])).sum().backward()
    assert jitted_copy.weight.grad.is_sparse
    optimizer.step()


class _Applied(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 6))
        self.fn = fn

    def forward(self, *args):
        return self.fn(self.weight, *args)


@pytest.mark.parametrize(
    "fn, args",
    [
        (lambda w: torch.nn.functional.softmax(w), ()),  # no dim: PyTorch picks one (and warns)
        (lambda w: torch.nn.functional.log_softmax(w), ()),
    ],
    ids=["softmax without dim", "log_softmax without dim"],
)
def test_call_forms_a_rule_does_not_cover_train_as_eager(fn, args):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # softmax's implicit dim
        _train_like_eager(_Applied(fn), *args)
