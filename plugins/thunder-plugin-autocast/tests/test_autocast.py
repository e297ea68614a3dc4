"""The autocast plugin against torch.autocast on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import thunder_core

# The comparisons run the torch executor only: they check where the plugin puts the casts. A
# fusion executor computes a bf16 elementwise chain in float32 inside its region (as
# torch.compile does), which differs from autocast's per-op rounding in the last bf16 bit.
TORCH_ONLY = {"executors": ["torch"]}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x, target):
        q, k, v = self.qkv(self.norm(x)).view(x.shape[0], x.shape[1], 3, 4, 8).unbind(2)
        attn = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        h = x + self.proj(attn.transpose(1, 2).reshape(x.shape))
        logits = self.head(torch.relu(h)).sum(1)
        return logits, nn.functional.cross_entropy(logits, target)


def _inputs():
    torch.manual_seed(0)
    return Block(), torch.randn(4, 6, 32), torch.tensor([1, 2, 3, 4])


def test_outputs_and_dtypes_match_torch_autocast():
    model, x, target = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected_logits, expected_loss = model(x, target)
    logits, loss = thunder_core.jit(model, plugins=["autocast"], **TORCH_ONLY)(x, target)
    assert logits.dtype == expected_logits.dtype == torch.bfloat16
    assert loss.dtype == expected_loss.dtype == torch.float32  # cross_entropy is on autocast's float32 list
    torch.testing.assert_close(logits, expected_logits)
    torch.testing.assert_close(loss, expected_loss)


def test_gradients_match_torch_autocast_and_stay_float32():
    model, x, target = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, target)[1].backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    thunder_core.jit(model, plugins=["autocast"], **TORCH_ONLY)(x, target)[1].backward()
    for n, p in model.named_parameters():
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, expected[n], msg=n)


def test_the_trace_shows_the_casts_and_the_plugin_pass():
    model, x, target = _inputs()
    jmodel = thunder_core.jit(model, plugins=["autocast"])
    with torch.no_grad():
        jmodel(x, target)
    traces = thunder_core.last_traces(jmodel)
    assert any("autocast.autocast (after_capture)" in str(t.provenance) for t in traces)
    final = traces[-1].python()
    assert "torch.Tensor.to(" in final and "torch.bfloat16" in final


def test_float16_option_and_bad_option():
    model, x, target = _inputs()
    with torch.no_grad():
        logits, _ = thunder_core.jit(
            model, plugins=["autocast"], options={"autocast": {"dtype": "float16"}}, **TORCH_ONLY
        )(x, target)
    assert logits.dtype == torch.float16
    with pytest.raises(thunder_core.ConfigError, match="dtype must be one of"):
        thunder_core.jit(model, plugins=["autocast"], options={"autocast": {"dtype": "int8"}})(x, target)


def test_not_enabled_unless_selected():
    model, x, target = _inputs()
    with torch.no_grad():
        logits, _ = thunder_core.jit(model)(x, target)
    assert logits.dtype == torch.float32


def test_litgpt_forward_matches_torch_autocast():
    from thunder_core.testing.models import small_litgpt

    torch.manual_seed(0)
    model = small_litgpt(n_embd=32).eval()
    idx = torch.randint(0, 128, (2, 16))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(idx)
    with torch.no_grad():
        actual = thunder_core.jit(model, plugins=["autocast"], **TORCH_ONLY)(idx)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected)
