"""Full backward hooks on a jitted module's submodules (``register_full_backward_hook`` and
``register_full_backward_pre_hook``): the hooks see eager's ``grad_input`` / ``grad_output`` on
every call, what they return replaces the gradients as in eager, and the parameters' gradients
equal eager's — through jit with each executor list, and through torch.compile."""

from __future__ import annotations

import copy

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


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def install_hooks(model: Net, log: list) -> None:
    def record(name):
        def hook(module, grad_input, grad_output):
            log.append((name, [g.clone() if g is not None else None for g in (*grad_input, *grad_output)]))

        return hook

    def scale_input(module, grad_input, grad_output):
        return tuple(g * 0.5 if g is not None else None for g in grad_input)

    def scale_output(module, grad_output):
        return tuple(g * 2 if g is not None else None for g in grad_output)

    model.embed.register_full_backward_hook(record("embed"))  # its input needs no gradient
    model.blocks[1].register_full_backward_hook(record("block 1"))
    model.blocks[1].register_full_backward_hook(scale_input)
    model.blocks[2].register_full_backward_pre_hook(scale_output)
    model.head.register_full_backward_hook(record("head"))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_full_backward_hooks_see_and_change_eager_gradients(front_end):
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    seen, expected_seen = [], []
    install_hooks(model, seen)
    install_hooks(reference, expected_seen)
    cmodel = compiled(model, front_end)
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        for _ in range(2):
            x = torch.randn(5, 4)
            expected = reference(x)
            expected.square().sum().backward()
            actual = cmodel(x)
            actual.square().sum().backward()
            torch.testing.assert_close(actual, expected)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert [name for name, _ in seen] == [name for name, _ in expected_seen]
    for (name, grads), (_, expected_grads) in zip(seen, expected_seen):
        assert len(grads) == len(expected_grads)
        for g, e in zip(grads, expected_grads):
            if e is None:
                assert g is None, name
            else:
                torch.testing.assert_close(g, e, msg=name)


class InPlaceHead(nn.Module):
    """An in-place update of a value that needs a gradient: PyTorch autograd records the program."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        y.mul_(2)
        return y


def test_a_program_autograd_records_whole_runs_the_real_hooks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), InPlaceHead())
    reference = copy.deepcopy(model)
    seen, expected_seen = [], []
    model[1].register_full_backward_hook(lambda m, gi, go: seen.append(gi[0].clone()))
    reference[1].register_full_backward_hook(lambda m, gi, go: expected_seen.append(gi[0].clone()))
    jmodel = thunder_core.jit(model)
    x = torch.randn(3, 4)
    jmodel(x).sum().backward()
    reference(x).sum().backward()
    assert len(seen) == len(expected_seen) == 1
    torch.testing.assert_close(seen[0], expected_seen[0])
    assert any("PyTorch autograd records" in note for note in jmodel._forward.last_compiled().notes)
