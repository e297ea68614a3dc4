"""The checkpoint plugin: what the forward saves shrinks, gradients stay eager's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import thunder_core
from thunder_core.testing.models import small_litgpt

TORCH_ONLY = ["torch"]


def _litgpt():
    torch.manual_seed(0)
    return small_litgpt(n_layer=4, n_embd=128, vocab=256, block_size=64)


def _tokens():
    return torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))


def _train_step(model, idx):
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _saved_activation_bytes(jitted) -> int:
    """Bytes of the tensors the executed forward keeps for the backward, parameters and inputs aside."""
    backward = thunder_core.last_backward_traces(jitted)
    forward = [t for t in thunder_core.last_traces(jitted) if t not in backward][-1]
    inputs = {p.name for p in forward.inputs}
    return sum(
        p.numel() * p.element_size()
        for p in forward.output[1]
        if hasattr(p, "numel") and p.name not in inputs
    )


def _jit(model, policy=None):
    plugins = {"plugins": ["checkpoint"], "options": {"checkpoint": {"policy": policy}}} if policy else {}
    return thunder_core.jit(model, executors=TORCH_ONLY, **plugins)


@pytest.mark.parametrize("policy", ["blocks", "matmuls", "nothing"])
def test_litgpt_gradients_equal_eager_and_less_is_saved(policy):
    model, idx = _litgpt(), _tokens()
    expected_loss, expected = _train_step(copy.deepcopy(model), idx)
    baseline = _jit(copy.deepcopy(model))
    _train_step(baseline, idx)
    checkpointed = _jit(copy.deepcopy(model), policy)
    loss, grads = _train_step(checkpointed, idx)
    torch.testing.assert_close(loss, expected_loss)
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")

    saved, without = _saved_activation_bytes(checkpointed), _saved_activation_bytes(baseline)
    assert saved < (without if policy == "matmuls" else without / 2)  # matmul outputs are most of it
    if policy == "nothing":
        assert saved <= 2 * 32 * 32 * 4  # only the RoPE tables sliced from buffers (not inputs themselves)
    backward = [b.symbol.name for b in thunder_core.last_backward_traces(checkpointed)[-1].bound_symbols]
    assert (
        "linear" in backward or "matmul" in backward or policy == "matmuls"
    )  # the forward's ops, recomputed
    assert any(
        "checkpoint (after_split)" in str(t.provenance) for t in thunder_core.last_traces(checkpointed)
    )


def test_blocks_policy_keeps_each_layers_input():
    model, idx = _litgpt(), _tokens()
    checkpointed = _jit(model, "blocks")
    _train_step(checkpointed, idx)
    backward = thunder_core.last_backward_traces(checkpointed)
    forward = [t for t in thunder_core.last_traces(checkpointed) if t not in backward][-1]
    inputs = {p.name for p in forward.inputs}
    residual = [p for p in forward.output[1] if p.name not in inputs and tuple(p.shape) == (2, 32, 128)]
    assert len(residual) == 4  # the residual stream entering each of the 4 layers


def test_random_ops_are_saved_not_drawn_again():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.GELU(),
        torch.nn.Dropout(0.3),
        torch.nn.Linear(32, 16),
        torch.nn.Tanh(),
    )
    x = torch.randn(8, 16)

    def grads(m):
        torch.manual_seed(7)
        m(x).square().mean().backward()
        return [p.grad.clone() for p in m.parameters()]

    expected = grads(copy.deepcopy(model))
    for got, want in zip(grads(_jit(copy.deepcopy(model), "nothing")), expected):
        torch.testing.assert_close(got, want)


def test_an_unknown_policy_names_the_known_ones():
    with pytest.raises(thunder_core.ConfigError, match="policy must be one of"):
        _train_step(_jit(_litgpt(), "everything"), _tokens())
