"""Real-model checks executor packages reuse: a small litgpt GPT trained through one executor."""

from __future__ import annotations

import torch

import thunder_core


def small_litgpt(
    n_layer: int = 2, n_embd: int = 64, vocab: int = 128, block_size: int = 32, n_query_groups: int = 4
):
    """A litgpt ``GPT`` (Llama-style: RMSNorm, SwiGLU MLP, RoPE) from a small config, random weights."""
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(
        name="thunder-core-check", block_size=block_size, vocab_size=vocab, padded_vocab_size=vocab,
        n_layer=n_layer, n_head=4, n_query_groups=n_query_groups, n_embd=n_embd, intermediate_size=2 * n_embd, bias=False,
        norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
    )  # fmt: skip
    return GPT(config)


def check_litgpt_training(
    executors: list[str], *, rtol: float = 1e-4, atol: float = 1e-5, **jit_arguments
) -> None:
    """One forward+backward of a small litgpt GPT through ``executors`` gives eager's loss and gradients.

    ``jit_arguments`` go to ``thunder_core.jit`` (``options``, ``select``, ...).
    """
    torch.manual_seed(0)
    model = small_litgpt()
    idx = torch.randint(0, 128, (2, 17))

    def loss(m):
        logits = m(idx[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))

    expected = loss(model)
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    actual = loss(thunder_core.jit(model, executors=executors, **jit_arguments))
    actual.backward()
    torch.testing.assert_close(actual, expected)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=rtol, atol=atol, msg=n)
