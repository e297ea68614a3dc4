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


@pytest.mark.slow
def test_hf_opt_training_with_layer_drop_and_dropout_matches_eager():
    """OPT (like BART, Whisper, Wav2Vec2, ...) draws ``torch.rand([])`` before each layer in
    training and skips the layer when the draw is below ``layerdrop`` (0.0 by default): the
    comparison is decided by the draw's bounds, so the program captures, with eager's dropout
    masks, loss and gradients."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(
        vocab_size=256, max_position_embeddings=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
        num_attention_heads=4, word_embed_proj_dim=32, dropout=0.1,
    )  # fmt: skip
    reference = OPTForCausalLM(config).train()
    model = OPTForCausalLM(config).train()
    model.load_state_dict(reference.state_dict())
    jmodel = thunder_core.jit(model)
    for length in (6, 9):
        idx = token_batch(2, length, seed=length)
        torch.manual_seed(length)
        expected = reference(idx, labels=idx).loss
        expected.backward()
        torch.manual_seed(length)
        loss = jmodel(idx, labels=idx).loss
        loss.backward()
        torch.testing.assert_close(loss, expected)
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
            p.grad, q.grad = None, None
    assert "torch.rand" in str(thunder_core.last_traces(jmodel)[0])  # the layer-drop draws, kept


def _greedy(model, prompt, steps):
    """litgpt's own KV-cache decoding: prefill the prompt, then one token at a time."""
    model.set_kv_cache(batch_size=1)
    input_pos = torch.arange(0, prompt.shape[1])
    logits = model(prompt, input_pos)
    tokens = []
    for _ in range(steps):
        token = logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(token))
        input_pos = input_pos[-1:] + 1
        logits = model(token, input_pos)
    return tokens


@pytest.mark.slow
@pytest.mark.parametrize("executors", [["torch"], ["inductor", "numba", "torch"]], ids=["torch", "default"])
def test_litgpt_kv_cache_generation_gives_eagers_tokens(executors):
    from thunder_core.testing.models import small_litgpt

    torch.manual_seed(0)
    model = small_litgpt(n_layer=2, block_size=64).eval()
    prompt = torch.randint(0, 128, (1, 5))
    with torch.no_grad():
        expected = _greedy(model, prompt, 32)
        jitted = thunder_core.jit(model, executors=executors)
        assert _greedy(jitted, prompt, 32) == expected
    info = thunder_core.cache_info(jitted)
    assert info.entries == 2, info.reasons  # the prefill and the one-token step, no per-token recompiles
    trace = thunder_core.last_traces(jitted)[-1]
    assert any("mask_cache" in p.name for p in trace.inputs), "the plain tensor attribute is a trace input"
