"""PyTorch modules' eager fast paths: a jitted module gives the values eager's fast path gives."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import thunder_core

LEFT_ALIGNED = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
NOT_LEFT_ALIGNED = torch.tensor([[False] * 5, [True] + [False] * 4, [False] * 4 + [True]])
NO_PADDING = torch.zeros(3, 5, dtype=torch.bool)


def _encoder(norm: bool, mask_check: bool = True) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    return nn.TransformerEncoder(
        layer, 2, norm=nn.LayerNorm(16) if norm else None, enable_nested_tensor=True, mask_check=mask_check
    ).eval()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(
    "padding", [LEFT_ALIGNED, NOT_LEFT_ALIGNED, NO_PADDING], ids=["left-aligned", "not-left-aligned", "none"]
)
@pytest.mark.parametrize("as_float", [False, True], ids=["bool-mask", "float-mask"])
def test_transformer_encoder_with_a_padding_mask_gives_eagers_zeros_at_padded_positions(
    norm, padding, as_float
):
    """In inference eager packs the unpadded positions into a nested tensor (its output is 0 at
    every padded position, or the final norm of 0); capture records the padded path, as
    torch.compile does, and sets those positions as eager leaves them."""
    model = _encoder(norm)
    jmodel = thunder_core.jit(model)
    mask = padding.float().masked_fill(padding, float("-inf")) if as_float else padding
    for length in (5, 4):  # a shorter batch: another program
        x = torch.randn(3, length, 16)
        m = mask[:, :length]
        with torch.no_grad():
            expected = model(x, src_key_padding_mask=m)
            got = jmodel(x, src_key_padding_mask=m)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if padding is LEFT_ALIGNED and not norm:
        assert (got[1, 3:] == 0).all()  # what the comparison above relies on


def _inference_as_eager(model, jmodel, **kwargs):
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        expected, got = model(x, **kwargs), jmodel(x, **kwargs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_transformer_encoder_without_the_mask_check_packs_as_eager():
    model = _encoder(norm=False, mask_check=False)
    _inference_as_eager(model, thunder_core.jit(model), src_key_padding_mask=LEFT_ALIGNED)


@pytest.mark.parametrize("training", [False, True])
def test_transformer_encoder_on_the_padded_path_keeps_padded_values_and_gradients(training):
    """With gradients wanted (or in training) eager takes the padded path: padded positions keep
    their computed values, and training gives eager's gradients."""
    model = _encoder(norm=True).train(training)
    reference = _encoder(norm=True).train(training)
    jmodel = thunder_core.jit(model)
    x = torch.randn(3, 5, 16)
    got = jmodel(x, src_key_padding_mask=LEFT_ALIGNED)
    expected = reference(x, src_key_padding_mask=LEFT_ALIGNED)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (expected[1, 3:].abs() > 0).any()
    got.square().sum().backward()
    expected.square().sum().backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


def test_the_encoder_outside_a_capture_runs_its_own_forward():
    forward = nn.TransformerEncoder.forward
    jmodel = thunder_core.jit(_encoder(norm=False))
    with torch.no_grad():
        jmodel(torch.randn(3, 5, 16), src_key_padding_mask=LEFT_ALIGNED)
    assert nn.TransformerEncoder.forward is forward


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_transformer_encoder_with_the_causal_hint_on_the_nested_path_runs_as_eager():
    """Eager's layers on the nested tensor ignore ``is_causal`` (and take no mask)."""
    model = _encoder(norm=False)
    _inference_as_eager(model, thunder_core.jit(model), src_key_padding_mask=LEFT_ALIGNED, is_causal=True)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_turning_pytorchs_attention_fast_path_off_between_calls_compiles_again():
    """``torch.backends.mha.set_fastpath_enabled(False)`` sends eager to the padded path: the
    program compiled with the fast path on is not reused."""
    model = _encoder(norm=False)
    jmodel = thunder_core.jit(model)
    try:
        for enabled in (True, False, True):
            torch.backends.mha.set_fastpath_enabled(enabled)
            _inference_as_eager(model, jmodel, src_key_padding_mask=LEFT_ALIGNED)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert thunder_core.cache_info(jmodel).entries == 2
