"""20 AdamW steps of real models through thunder_core give eager's losses and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from models import hf_llama, litgpt_gpt, token_batch

import thunder_core

STEPS = 20


def _litgpt_loss(model, idx):
    logits = model(idx[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def _hf_loss(model, idx):
    return model(idx, labels=idx).loss


def _train(model, loss_fn, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, first_grads = [], None
    for step, idx in enumerate(batches):
        opt.zero_grad()
        loss = loss_fn(model, idx)
        loss.backward()
        if step == 0:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return losses, first_grads


@pytest.mark.slow
@pytest.mark.parametrize("name", ["litgpt", "hf_llama"])
def test_twenty_adamw_steps_match_eager(name):
    torch.manual_seed(0)
    build, loss_fn = (litgpt_gpt, _litgpt_loss) if name == "litgpt" else (hf_llama, _hf_loss)
    eager = build()
    compiled = copy.deepcopy(eager)
    batches = [token_batch(2, 33, seed=i) for i in range(STEPS)]
    expected_losses, expected_grads = _train(eager, loss_fn, batches)
    jitted = thunder_core.jit(compiled)
    losses, grads = _train(jitted, loss_fn, batches)
    assert thunder_core.cache_info(jitted).entries == 1
    assert thunder_core.last_backward_traces(jitted), "the training step went through thunder_core's autodiff"
    torch.testing.assert_close(losses, expected_losses, rtol=1e-4, atol=0)
    assert grads.keys() == expected_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], expected_grads[n], rtol=1e-4, atol=1e-5, msg=n)


def test_an_index_assignment_into_a_copy_trains_like_eager():
    """``z[0] = y[0]`` returns nothing, yet z then depends on y: both get eager's gradients (the
    functional transforms, which cannot differentiate it, refuse it with the reason)."""

    def overwrite(x, y):
        z = x.clone()
        z[0] = y[0]
        return (z * torch.tensor([1.0, 2.0, 3.0])).sum()

    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    thunder_core.jit(overwrite)(x, y).backward()
    ours = (x.grad, y.grad)
    x.grad = y.grad = None
    overwrite(x, y).backward()
    torch.testing.assert_close(ours, (x.grad, y.grad))
    with pytest.raises(thunder_core.ThunderCoreError, match="in-place torch.Tensor.__setitem__"):
        thunder_core.grad(overwrite, argnums=(0, 1))(x.detach(), y.detach())


def test_a_module_filling_a_fresh_tensor_by_index_assignment_trains_like_eager():
    """A fresh tensor that needs no gradient becomes one that does through ``out[:, 0] = h[:, 0]``."""

    class Filled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)

        def forward(self, x):
            h = self.linear(x)
            out = torch.empty_like(h)
            out[:, 0] = h[:, 0]
            out[:, 1:] = h[:, 1:].relu()
            return out.square().sum()

    torch.manual_seed(0)
    model, x = Filled(), torch.randn(2, 3)
    reference = copy.deepcopy(model)
    thunder_core.jit(model)(x).backward()
    reference(x).backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)


class _TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
            for _ in range(3)
        )
        self.head_a, self.head_b = torch.nn.Linear(8, 2), torch.nn.Linear(8, 3)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        b = self.head_b(x)
        return self.head_a(x), b, b.argmax(-1)  # the indices: an output that passes no gradient


@pytest.mark.parametrize("used", [0, 1])
def test_parameters_of_an_output_the_loss_does_not_use_get_no_gradient(used):
    # They got zeros, so AdamW decayed and moved them where eager's step skips them
    # (torch.compile's own backends give zeros too)
    torch.manual_seed(0)
    model = _TwoHeads()
    jitted_copy = copy.deepcopy(model)
    jmodel = thunder_core.jit(jitted_copy)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.1, weight_decay=0.1) for m in (model, jitted_copy)]
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        for m in (model, jmodel):
            m(x)[used].sum().backward()
        for (name, p), q in zip(model.named_parameters(), jitted_copy.parameters()):
            assert (p.grad is None) == (q.grad is None), name
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
    for (name, p), q in zip(model.named_parameters(), jitted_copy.parameters()):
        torch.testing.assert_close(q, p, msg=name)


def test_an_output_without_a_derivative_that_the_loss_does_not_use_trains_as_eager():
    # Eager never runs igamma's backward (it has none); the program's backward received zeros
    # for that output and PyTorch's autograd raised on them
    def f(x):
        return x.sin(), torch.igamma(x, x + 1)

    x = torch.linspace(0.1, 2, 5, requires_grad=True)
    f(x)[0].sum().backward()
    expected, x.grad = x.grad, None
    thunder_core.jit(f)(x)[0].sum().backward()
    torch.testing.assert_close(x.grad, expected)
