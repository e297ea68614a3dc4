"""A corpus of ordinary PyTorch programs, forward and training, against eager.

Each model is built twice from the same weights; one copy is jitted. Both take the same
optimizer steps on the same data, and losses, outputs, parameters and buffers (BatchNorm's
running statistics included) must match eager on every step. Each runs with the torch
executor alone and with the default CPU executors.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import thunder_core

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]


@pytest.fixture(params=["torch", "default"])
def executors(request):
    return ["torch"] if request.param == "torch" else DEFAULT_EXECUTORS


def _loss(out):
    if isinstance(out, dict):
        return sum(v.float().pow(2).mean() for v in out.values())
    if isinstance(out, (tuple, list)):
        return sum(_loss(o) for o in out if isinstance(o, torch.Tensor) or isinstance(o, (dict, tuple, list)))
    return out.float().pow(2).mean()


def check_training(model: nn.Module, make_inputs, executors, *, steps: int = 3, lr: float = 0.05, tol=1e-5):
    """Forward, backward and SGD steps of ``jit(model)`` equal eager's, step by step."""
    reference = copy.deepcopy(model)
    jitted = thunder_core.jit(model, executors=executors)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        args, kwargs = make_inputs(step)
        ref_args, ref_kwargs = copy.deepcopy((args, kwargs))
        opt.zero_grad()
        ref_opt.zero_grad()
        loss = _loss(jitted(*args, **kwargs))
        expected = _loss(reference(*ref_args, **ref_kwargs))
        torch.testing.assert_close(loss, expected, rtol=tol, atol=tol, msg=f"loss at step {step}")
        loss.backward()
        expected.backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if q.grad is None:
                assert p.grad is None, name
            else:
                torch.testing.assert_close(p.grad, q.grad, rtol=tol * 10, atol=tol * 10, msg=f"{name}.grad")
        opt.step()
        ref_opt.step()
        for (name, b), c in zip(model.named_buffers(), reference.buffers()):
            torch.testing.assert_close(b, c, rtol=tol, atol=tol, msg=name)
    return jitted, reference


def check_inference(model: nn.Module, args, executors, **kwargs):
    jitted = thunder_core.jit(model, executors=executors)
    with torch.no_grad():
        torch.testing.assert_close(jitted(*args, **kwargs), model(*args, **kwargs))
    return jitted


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        )  # fmt: skip
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.pool(self.features(x)).flatten(1))


def test_convnet_with_batchnorm_train_and_eval(executors):
    torch.manual_seed(0)
    model = ConvNet()
    data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    jitted, reference = check_training(model, lambda i: ((data[i],), {}), executors)
    assert model.features[1].num_batches_tracked.item() == 3
    model.eval()
    reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(jitted(data[0]), reference(data[0]), rtol=1e-5, atol=1e-5)


def test_dropout_statistics_in_train_mode_and_identity_in_eval(executors):
    dropout = nn.Sequential(nn.Dropout(0.3))
    jitted = thunder_core.jit(dropout, executors=executors)
    x = torch.ones(200_000)
    out = jitted(x)
    zeros = (out == 0).float().mean().item()
    assert abs(zeros - 0.3) < 0.01
    torch.testing.assert_close(out[out != 0], torch.full_like(out[out != 0], 1 / 0.7))
    assert not torch.equal(jitted(x), out), "a fresh mask on every call"
    dropout.eval()
    torch.testing.assert_close(jitted(x), x)


class Stacked(nn.Module):
    """ModuleList and ModuleDict, chosen by a config string read in forward."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(6, 6), nn.GELU()) for _ in range(3)])
        self.heads = nn.ModuleDict({"regress": nn.Linear(6, 1), "classify": nn.Linear(6, 3)})
        self.task = "regress"

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.heads[self.task](x)


def test_module_list_and_dict_with_a_config_switch(executors):
    torch.manual_seed(0)
    model = Stacked()
    data = torch.randn(5, 6)
    check_training(model, lambda i: ((data + i,), {}), executors)
    model.task = "classify"
    check_training(model, lambda i: ((data - i,), {}), executors, steps=2)


class Recurrent(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.rnn = getattr(nn, kind)(input_size=4, hidden_size=5, num_layers=2, batch_first=True)
        self.out = nn.Linear(5, 2)

    def forward(self, x):
        seq, _ = self.rnn(x)
        return self.out(seq[:, -1])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layers(kind, executors):
    torch.manual_seed(0)
    data = torch.randn(3, 7, 4)
    check_training(Recurrent(kind), lambda i: ((data * (i + 1),), {}), executors)


class TiedLM(nn.Module):
    """Embedding with padding_idx and an output layer tied to it."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8, padding_idx=0)
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 20, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens, *, targets):
        logits = self.lm_head(self.norm(self.embed(tokens)))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0)
        return {"logits": logits, "loss": loss}


def test_tied_weights_padding_idx_kwargs_only_and_dict_output(executors):
    torch.manual_seed(0)
    model = TiedLM()
    tokens = torch.tensor([[0, 3, 5, 0], [7, 0, 2, 9]])
    jitted, _ = check_training(model, lambda i: ((tokens,), {"targets": (tokens + i) % 20}), executors)
    out = jitted(tokens, targets=tokens)
    assert set(out) == {"logits", "loss"}
    assert model.lm_head.weight is model.embed.weight
    out["loss"].backward()


class WithCounters(nn.Module):
    """In-place updates of a buffer and of an input."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x, scratch):
        self.calls.add_(1)
        with torch.no_grad():
            self.running.mul_(0.9).add_(x.mean(0), alpha=0.1)
        scratch.copy_(x.sum(0))
        return self.linear(x) + self.running, [scratch * 2]


def test_inplace_updates_of_buffers_and_inputs(executors):
    torch.manual_seed(0)
    model = WithCounters()
    data = torch.randn(4, 3)
    scratches = [torch.zeros(3) for _ in range(3)]
    check_training(model, lambda i: ((data * i, scratches[i]), {}), executors)
    assert model.calls.item() == 3
    torch.testing.assert_close(scratches[2], (data * 2).sum(0))


def test_aliased_inputs(executors):
    def fn(a, b):
        return (a * b).sum() + a.sum()

    jf = thunder_core.jit(fn, executors=executors)
    x = torch.randn(4, requires_grad=True)
    (expected,) = torch.autograd.grad(fn(x, x), x)
    (actual,) = torch.autograd.grad(jf(x, x), x)
    torch.testing.assert_close(actual, expected)
    y = torch.randn(4, 4)
    torch.testing.assert_close(jf(y, y[0]), fn(y, y[0]))

    def inplace(a, b):
        a.add_(1)
        return b * 2

    z = torch.zeros(3)
    torch.testing.assert_close(thunder_core.jit(inplace, executors=executors)(z, z), torch.full((3,), 2.0))
    torch.testing.assert_close(z, torch.ones(3))


class CustomFunction(torch.autograd.Function):
    """Straight-through rounding: forward rounds, backward passes the gradient through scaled."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return torch.round(x * scale) / scale

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5, None


class Quantized(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return CustomFunction.apply(self.linear(x), 4.0).relu()


def test_autograd_function_backward_is_used_as_written(executors):
    torch.manual_seed(0)
    data = torch.randn(6, 4)
    jitted, _ = check_training(Quantized(), lambda i: ((data + i,), {}), executors)
    assert "CustomFunction.apply" in thunder_core.last_traces(jitted)[0].python()


def test_list_outputs_and_functools_partial(executors):
    import functools

    def fn(x, *, power, shift=0.0):
        return [x**power, {"shifted": x + shift}]

    jf = thunder_core.jit(functools.partial(fn, power=2), executors=executors)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x, shift=1.0), fn(x, power=2, shift=1.0))
