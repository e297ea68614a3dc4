"""Token-by-token decoding through litgpt's KV cache, as ``benchmarks/generate.py`` runs it."""

from __future__ import annotations

import pytest
import torch
from models import litgpt_gpt, token_batch

import thunder_core
from thunder_core.jit import guards

STEPS = 32


def _greedy(model, prompt, steps: int) -> list[int]:
    input_pos = torch.arange(prompt.shape[1])
    logits = model(prompt, input_pos)
    token = logits[:, -1].argmax(-1, keepdim=True)
    tokens = [int(token)]
    for _ in range(steps - 1):
        input_pos = input_pos[-1:] + 1
        logits = model(token, input_pos)
        token = logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(token))
    return tokens


@pytest.mark.parametrize("cache", ["guarded", "same input"])
def test_greedy_decoding_through_the_kv_cache_matches_eager_and_compiles_twice(cache):
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64, vocab=256, block_size=64).eval()
    prompt = token_batch(1, 8)
    with torch.no_grad():
        model.set_kv_cache(batch_size=1)
        expected = _greedy(model, prompt, STEPS)
        model.set_kv_cache(batch_size=1)  # fresh, empty caches
        jmodel = thunder_core.jit(model, cache=cache)
        tokens = _greedy(jmodel, prompt, STEPS)
    assert tokens == expected
    assert len(set(expected)) > 1  # a degenerate model would repeat one token and prove little
    info = thunder_core.cache_info(jmodel)
    assert info.entries == 2, info.reasons  # the prefill and one decode step: none per position
    assert info.hits == STEPS - 2

    # The caches were updated in place by the compiled program: the same prompt again, on
    # reset caches, gives the same tokens without compiling anything new.
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.kv_cache.reset_parameters()
        assert _greedy(jmodel, prompt, STEPS) == expected
    assert thunder_core.cache_info(jmodel).entries == 2


def test_new_kv_caches_for_every_prompt_reuse_the_compiled_entries():
    """``set_kv_cache`` builds new cache modules: equal ones, so nothing recompiles, and the
    compiled program writes into the new caches (not the ones it was compiled with)."""
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64, vocab=256, block_size=64).eval()
    jmodel = thunder_core.jit(model)
    with torch.no_grad():
        for seed in range(5):  # more prompts than recompile_limit / 2
            prompt = token_batch(1, 8, seed=seed)
            model.set_kv_cache(batch_size=1)
            expected = _greedy(model, prompt, 12)
            model.set_kv_cache(batch_size=1)
            caches = [block.attn.kv_cache for block in model.transformer.h]
            assert _greedy(jmodel, prompt, 12) == expected
            assert all(bool(cache.k.any()) for cache in caches)  # written by the compiled program
    info = thunder_core.cache_info(jmodel)
    assert info.entries == 2, info.reasons


def test_a_rebound_guard_reuses_the_compiled_checks():
    """The guard re-made for new cache modules has the same text as the one it replaces: once the
    first rebinds have compiled its checks (and, on its first failure, the listing of what
    failed), later rebinds compile nothing again (compiling it took as long as the prefill)."""
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64, vocab=256, block_size=64).eval()
    jmodel = thunder_core.jit(model)
    prompt = token_batch(1, 8)
    with torch.no_grad():
        for _ in range(3):  # the first call, then rebinds to new cache modules
            model.set_kv_cache(batch_size=1)
            jmodel(prompt, torch.arange(8))
        compiled_before = guards._compiled.cache_info().misses
        for _ in range(2):
            model.set_kv_cache(batch_size=1)
            logits = jmodel(prompt, torch.arange(8))
            model.set_kv_cache(batch_size=1)
            torch.testing.assert_close(logits, model(prompt, torch.arange(8)))
    assert guards._compiled.cache_info().misses == compiled_before
    assert thunder_core.cache_info(jmodel).entries == 1
