"""Small real models with random weights, shared by tests and benchmarks."""

from __future__ import annotations

import torch

from thunder_core.testing.models import small_litgpt


def litgpt_gpt(n_layer: int = 2, n_embd: int = 64, vocab: int = 256, block_size: int = 64):
    return small_litgpt(n_layer, n_embd, vocab, block_size, n_query_groups=2)


def hf_llama(n_layer: int = 2, hidden: int = 64, vocab: int = 256):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def token_batch(batch: int, length: int, vocab: int = 256, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=generator)
