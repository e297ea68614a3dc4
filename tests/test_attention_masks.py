"""A boolean attention mask shared by several of torch's attention calls is made additive once
(``thunder_core.executors.attention_masks``), with eager's results bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_core


def three_layers(x, mask, positional: bool = False):
    for _ in range(3):
        q, k, v = x, x * 0.5, x.flip(-2)
        if positional:
            x = F.scaled_dot_product_attention(q, k, v, mask) + x
        else:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3) + x
    return x


def _mask(length: int) -> torch.Tensor:
    mask = torch.rand(1, 1, length, length, generator=torch.Generator().manual_seed(length)) > 0.4
    mask[..., 0] = True
    mask[..., 1, :] = False  # a row that attends to nothing
    return mask


def _program(jfn) -> str:
    return thunder_core.last_traces(jfn)[-1].python()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("positional", [False, True])
def test_a_shared_boolean_mask_is_converted_once_with_eagers_results(dtype, positional):
    x = torch.randn(2, 4, 9, 16, dtype=dtype)
    mask = _mask(9)
    jfn = thunder_core.jit(three_layers, executors=["torch"])
    torch.testing.assert_close(
        jfn(x, mask, positional), three_layers(x, mask, positional), rtol=0, atol=0, equal_nan=True
    )
    program = _program(jfn)
    assert program.count("torch.where(") == 1, program
    calls = [
        line for line in program.splitlines() if "= torch.nn.functional.scaled_dot_product_attention(" in line
    ]
    masks = [_mask_argument(line) for line in calls]
    assert len(masks) == 3 and len(set(masks)) == 1 and masks[0] != "mask", program  # one additive mask


def _mask_argument(line: str) -> str:
    arguments = line.split("scaled_dot_product_attention(", 1)[1].split(")", 1)[0].split(", ")
    named = [a.removeprefix("attn_mask=") for a in arguments if a.startswith("attn_mask=")]
    return named[0] if named else arguments[3]


def test_with_the_default_executors_the_results_are_eagers_bit_for_bit():
    x, mask = torch.randn(1, 2, 5, 8), _mask(5)
    jfn = thunder_core.jit(three_layers)
    torch.testing.assert_close(jfn(x, mask), three_layers(x, mask), rtol=0, atol=0)


def test_a_mask_used_once_or_in_training_stays_boolean():
    x, mask = torch.randn(1, 2, 5, 8), _mask(5)

    def one_layer(x, mask):
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)

    once = thunder_core.jit(one_layer, executors=["torch"])
    torch.testing.assert_close(once(x, mask), one_layer(x, mask), rtol=0, atol=0)
    assert "torch.where(" not in _program(once)

    leaf = x.clone().requires_grad_()
    training = thunder_core.jit(three_layers, executors=["torch"])
    training(leaf, mask).sum().backward()
    expected = x.clone().requires_grad_()
    three_layers(expected, mask).sum().backward()
    torch.testing.assert_close(leaf.grad, expected.grad)
    assert all("torch.where(" not in t.python() for t in thunder_core.last_traces(training))


def test_a_mask_written_in_place_between_the_calls_is_converted_at_each():
    def written_between(x):
        mask = torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool).tril()
        first = F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
        mask[:, 0] = False  # the second call sees the mask as it is now
        return first, F.scaled_dot_product_attention(x, x, x, attn_mask=mask)

    x = torch.randn(1, 2, 5, 8)
    jfn = thunder_core.jit(written_between, executors=["torch"])
    for got, expected in zip(jfn(x), written_between(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    assert "torch.where(" not in _program(jfn)


def test_keyword_query_key_and_value_share_the_conversion():
    def by_keyword(x, mask):
        first = F.scaled_dot_product_attention(query=x, key=x, value=x, attn_mask=mask)
        return F.scaled_dot_product_attention(query=first, key=x, value=x, attn_mask=mask)

    x, mask = torch.randn(1, 2, 5, 8), _mask(5)
    jfn = thunder_core.jit(by_keyword, executors=["torch"])
    torch.testing.assert_close(jfn(x, mask), by_keyword(x, mask), rtol=0, atol=0, equal_nan=True)
    assert _program(jfn).count("torch.where(") == 1
