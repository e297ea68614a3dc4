"""Small real models with random weights, shared by tests and benchmarks."""

from __future__ import annotations

import torch


def litgpt_gpt(n_layer: int = 2, n_embd: int = 64, vocab: int = 256, block_size: int = 64):
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(
        name="thunder-core-test",
        block_size=block_size,
        vocab_size=vocab,
        padded_vocab_size=vocab,
        n_layer=n_layer,
        n_head=4,
        n_query_groups=2,
        n_embd=n_embd,
        intermediate_size=4 * n_embd,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        rotary_percentage=1.0,
        parallel_residual=False,
    )
    return GPT(config)


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
