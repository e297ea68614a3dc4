"""Grouped-query attention on the shared key/value heads (transforms/grouped_attention.py),
checked against eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_core


def _repeat_kv(x, groups):  # Hugging Face's repeat_kv
    b, h, length, d = x.shape
    return x[:, :, None, :, :].expand(b, h, groups, length, d).reshape(b, h * groups, length, d)


def _attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), attn_mask=mask)


def _inputs(length=7, requires_grad=False):
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(2, h, n, 16, generator=g) for h, n in ((8, 3), (4, length), (4, length)))
    mask = torch.rand(2, 1, 3, length, generator=g) > 0.3
    return [t.requires_grad_(requires_grad) for t in (q, k, v)] + [mask]


def _program(jfn) -> str:
    return str(thunder_core.last_traces(jfn)[-1])


@pytest.mark.parametrize("dynamic", [False, True])
def test_attention_on_repeated_heads_reads_the_shared_heads_without_copies(dynamic):
    jfn = thunder_core.jit(_attention, executors=["torch"], dynamic=dynamic)
    for length in (7, 12, 5):
        args = _inputs(length)
        torch.testing.assert_close(jfn(*args), _attention(*args))
    program = _program(jfn)
    assert "enable_gqa=True" in program and "expand" not in program and "reshape" not in program, program


def test_training_gives_eagers_gradients():
    # With gradients the attention is differentiated (autodiff's own attention rule) before the
    # rewrite runs; this checks the whole path, not the rewrite's own autograd condition.
    jfn = thunder_core.jit(_attention, executors=["torch"])
    args = _inputs(requires_grad=True)
    ours = jfn(*args)
    ours.sum().backward()
    grads = [t.grad for t in args[:3]]
    for t in args[:3]:
        t.grad = None
    expected = _attention(*args)
    expected.sum().backward()
    torch.testing.assert_close(ours, expected)
    for got, t in zip(grads, args[:3]):
        torch.testing.assert_close(got, t.grad)


def _tile_kv(x, groups):  # the heads tiled (h0, h1, ..., h0, h1, ...): not grouped-query attention's layout
    b, h, length, d = x.shape
    return x[:, None].expand(b, groups, h, length, d).reshape(b, groups * h, length, d)


def _other_groupings(q, k, v, mask):
    return F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _tile_kv(v, 2), attn_mask=mask)


def _unsqueezed(q, k, v, mask):  # the same layout through unsqueeze
    def repeat(x):
        return x.unsqueeze(2).expand(2, 4, 2, x.shape[2], 16).reshape(2, 8, x.shape[2], 16)

    return F.scaled_dot_product_attention(q, repeat(k), repeat(v), attn_mask=mask)


def test_the_unsqueeze_form_is_grouped_too():
    jfn = thunder_core.jit(_unsqueezed, executors=["torch"])
    args = _inputs()
    torch.testing.assert_close(jfn(*args), _unsqueezed(*args))
    assert "enable_gqa=True" in _program(jfn)


def _copy_written(q, k, v, mask):
    keys = _repeat_kv(k, 2)
    keys[:, 0] = 0.0  # eager's attention reads the copy with this write
    return F.scaled_dot_product_attention(q, keys, _repeat_kv(v, 2), attn_mask=mask)


def _base_written_after_the_copy(q, k, v, mask):
    keys = _repeat_kv(k, 2)
    k.mul_(2.0)  # the copy holds the values from before
    return F.scaled_dot_product_attention(q, keys, _repeat_kv(v, 2), attn_mask=mask)


@pytest.mark.parametrize("fn", [_copy_written, _base_written_after_the_copy], ids=["copy", "base"])
def test_a_write_between_the_copy_and_the_attention_keeps_the_copy(fn):
    jfn = thunder_core.jit(fn, executors=["torch"])
    args, expected_args = _inputs(), _inputs()
    torch.testing.assert_close(jfn(*args), fn(*expected_args))
    assert "enable_gqa" not in _program(jfn)


def _copies_used_elsewhere(q, k, v, mask):
    keys = _repeat_kv(k, 2)
    return F.scaled_dot_product_attention(q, keys, _repeat_kv(v, 2), attn_mask=mask) + keys[:, :, :3].sum()


def test_other_layouts_stay_as_written_and_copies_used_elsewhere_are_kept():
    args = _inputs()
    tiled = thunder_core.jit(_other_groupings, executors=["torch"])
    torch.testing.assert_close(tiled(*args), _other_groupings(*args))
    assert "enable_gqa" not in _program(tiled)
    shared = thunder_core.jit(_copies_used_elsewhere, executors=["torch"])
    torch.testing.assert_close(shared(*args), _copies_used_elsewhere(*args))
    program = _program(shared)
    statements = [line for line in program.splitlines() if not line.lstrip().startswith("#")]
    assert "enable_gqa=True" in program, program
    assert sum("torch.Tensor.reshape(" in line for line in statements) == 1, program  # the keys' copy


def _broadcast_query(q, k, v, mask):  # one query head for all eight: broadcast, not grouped
    return F.scaled_dot_product_attention(q[:, :1], _repeat_kv(k, 2), _repeat_kv(v, 2), attn_mask=mask)


def test_a_query_broadcast_over_the_heads_stays_as_written():
    jfn = thunder_core.jit(_broadcast_query, executors=["torch"])
    args = _inputs()
    torch.testing.assert_close(jfn(*args), _broadcast_query(*args))
    assert "enable_gqa" not in _program(jfn)
