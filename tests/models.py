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


def hf_zoo() -> dict:
    """Small Hugging Face models of several families (random weights), by name: what users jit."""
    import transformers as T

    def causal(config_class, model_class, **sizes):
        return lambda: model_class(
            config_class(vocab_size=256, max_position_embeddings=128, use_cache=False, **sizes)
        )

    decoder = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)  # fmt: skip
    return {
        "llama": causal(T.LlamaConfig, T.LlamaForCausalLM, **decoder),
        "mistral": causal(T.MistralConfig, T.MistralForCausalLM, **decoder),
        "qwen2": causal(T.Qwen2Config, T.Qwen2ForCausalLM, **decoder),
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128, use_cache=False)
        ),
        "bert": lambda: T.BertForSequenceClassification(
            T.BertConfig(
                vocab_size=256,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                max_position_embeddings=128,
            )  # fmt: skip
        ),
        "t5": lambda: T.T5ForConditionalGeneration(
            T.T5Config(
                vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, use_cache=False
            )
        ),
    }


def token_batch(batch: int, length: int, vocab: int = 256, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=generator)


def greedy_generate(model, prompt: torch.Tensor, **kwargs) -> torch.Tensor:
    """Hugging Face ``generate``: 6 greedy tokens with the cache on (``kwargs`` add to them)."""
    with torch.no_grad():
        return model.generate(
            prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, use_cache=True, **kwargs
        )
