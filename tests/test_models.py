"""Real model code nobody here wrote, through thunder_core, against eager."""

from __future__ import annotations

import pytest
import torch
from models import hf_llama, litgpt_gpt, token_batch

import thunder_core


@pytest.mark.slow
def test_litgpt_gpt_forward_matches_eager():
    torch.manual_seed(0)
    model = litgpt_gpt().eval()
    idx = token_batch(2, 32)
    jmodel = thunder_core.jit(model)
    torch.testing.assert_close(jmodel(idx), model(idx))
    # the trace is a real decomposition of the model, not one opaque call
    trace = thunder_core.last_traces(jmodel)[0]
    names = {b.symbol.name for b in trace.bound_symbols}
    assert {"embedding", "scaled_dot_product_attention", "linear"} <= names


@pytest.mark.slow
def test_hf_llama_forward_matches_eager():
    torch.manual_seed(0)
    model = hf_llama().eval()
    idx = token_batch(2, 32)
    jmodel = thunder_core.jit(model)
    expected = model(idx).logits
    actual = jmodel(idx)
    assert type(actual) is type(model(idx))  # the ModelOutput comes back as one
    torch.testing.assert_close(actual.logits, expected)
    # a second call with a new batch runs from the cache
    idx2 = token_batch(2, 32, seed=1)
    torch.testing.assert_close(jmodel(idx2).logits, model(idx2).logits)
    assert thunder_core.cache_info(jmodel).hits == 1


@pytest.mark.slow
def test_hf_llama_loss_and_backward_match_eager():
    torch.manual_seed(0)
    model = hf_llama()
    jmodel = thunder_core.jit(model)
    idx = token_batch(2, 16)
    loss = jmodel(idx, labels=idx).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected = model(idx, labels=idx).loss
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, msg=n)
