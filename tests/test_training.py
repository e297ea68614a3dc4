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
