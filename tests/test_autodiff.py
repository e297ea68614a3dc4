"""Autodiff: training through thunder_core behaves like eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_core
from thunder_core.ir.symbols import AUTOGRAD_FALLBACK


def _grads(fn, *tensors):
    tensors = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    out = fn(*tensors)
    out.backward()
    return out.detach(), [t.grad for t in tensors]


def mlp_loss(x, w1, b1, w2):
    h = F.silu(F.linear(x, w1, b1))
    return F.cross_entropy(h @ w2, torch.arange(x.shape[0]) % w2.shape[1])


def _params():
    torch.manual_seed(0)
    return (
        torch.randn(8, 16),
        torch.randn(32, 16, requires_grad=True),
        torch.randn(32, requires_grad=True),
        torch.randn(32, 10, requires_grad=True),
    )


def test_loss_and_gradients_match_eager():
    args = _params()
    expected_loss, expected = _grads(mlp_loss, *args)
    loss, actual = _grads(thunder_core.jit(mlp_loss), *args)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(actual, expected)  # x does not require grad: None in both


def test_forward_and_backward_traces_are_both_in_last_traces():
    jfn = thunder_core.jit(mlp_loss)
    jfn(*_params()).backward()
    traces = thunder_core.last_traces(jfn)
    assert [t.function_name for t in traces].count("forward") >= 2
    assert traces[-1].function_name == "backward"
    backward = thunder_core.last_backward_traces(jfn)[-1].python()
    assert "torch.ops.aten._log_softmax_backward_data" in backward  # the fused kernel eager uses
    assert "torch.ops.aten.silu_backward" in backward


def test_only_what_backward_reads_is_saved():
    def fn(a, w):
        h = torch.exp(a @ w)  # exp's output is needed by its backward
        return h.sum() + torch.sin(a).sum() * 0  # sin(a)'s grad is not needed: a needs no grad

    a, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    jfn = thunder_core.jit(fn)
    jfn(a, w).backward()
    forward = [t for t in thunder_core.last_traces(jfn) if t.function_name == "forward"][-1]
    saved = {p.name for p in forward.output[1]}
    assert "a" in saved  # w's gradient reads a
    assert "w" not in saved  # a needs no gradient, so w is not needed in backward


def test_gradient_accumulation_and_optimizer_steps():
    args = _params()
    jfn = thunder_core.jit(mlp_loss)
    params = [t.detach().clone().requires_grad_(t.requires_grad) for t in args]
    ref = [t.detach().clone().requires_grad_(t.requires_grad) for t in args]
    opt = torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-2)
    opt_ref = torch.optim.AdamW([p for p in ref if p.requires_grad], lr=1e-2)
    for _ in range(3):
        for _ in range(2):  # two micro-batches accumulate into .grad
            jfn(*params).backward()
            mlp_loss(*ref).backward()
        opt.step(), opt_ref.step()
        opt.zero_grad(), opt_ref.zero_grad()
    torch.testing.assert_close(params, ref)


def test_non_differentiable_outputs_and_mixed_requires_grad():
    def fn(x, y):
        return x * y, (x > 0), x.argmax()

    x, y = torch.randn(5, requires_grad=True), torch.randn(5)
    prod, mask, index = thunder_core.jit(fn)(x, y)
    assert prod.requires_grad and not mask.requires_grad and not index.requires_grad
    prod.sum().backward()
    torch.testing.assert_close(x.grad, y)


def test_no_grad_inference_builds_no_backward():
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    jfn = thunder_core.jit(lambda x, w: torch.tanh(x @ w))
    with torch.no_grad():
        out = jfn(x, w)
    assert out.grad_fn is None and not out.requires_grad
    assert thunder_core.last_backward_traces(jfn) == []
    forward = thunder_core.last_traces(jfn)[-1]
    assert forward.function_name == "computation"  # a plain trace, nothing saved


def test_ops_without_a_rule_fall_back_to_pytorch_autograd_and_say_so():
    def fn(x):
        return torch.special.i0(x).sum() + torch.cummax(x, 0).values.sum()

    x = torch.randn(6, requires_grad=True)
    (expected,) = torch.autograd.grad(fn(x), x)
    jfn = thunder_core.jit(fn)
    (actual,) = torch.autograd.grad(jfn(x), x)
    torch.testing.assert_close(actual, expected)
    forward = [t for t in thunder_core.last_traces(jfn) if t.function_name == "forward"][-1]
    assert any(b.symbol.has_tag(AUTOGRAD_FALLBACK) for b in forward.bound_symbols)
    assert "autodiff: no VJP rule, differentiated by PyTorch autograd" in forward.python()


def test_inplace_on_values_needing_grad_falls_back_to_pytorch_autograd():
    def fn(x):
        y = x * 2
        y.add_(1)
        return y.sum()

    x = torch.randn(3, requires_grad=True)
    thunder_core.jit(fn)(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_keep_input_dtypes(dtype):
    x = torch.randn(3, 4, dtype=dtype, requires_grad=True)
    w = torch.randn(4, dtype=torch.float32, requires_grad=True)
    thunder_core.jit(lambda x, w: (x * w).sum())(x, w).backward()
    assert x.grad.dtype == dtype and w.grad.dtype == torch.float32


def test_cuda_attention_trains_through_the_efficient_attention_kernels():
    # Traced on fake CUDA tensors (no GPU needed): the backward must call PyTorch's memory-efficient
    # attention backward, not differentiate a materialized softmax(QK^T) matrix.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from thunder_core.autodiff.joint import split_forward_backward
    from thunder_core.capture.capture import capture

    with FakeTensorMode():
        q, k, v = (torch.empty(2, 4, 16, 8, device="cuda", requires_grad=True) for _ in range(3))
        mask = torch.empty(16, 16, dtype=torch.bool, device="cuda")

    def attention(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    trace, _ = capture(attention, (q, k, v, mask), {}, positional_names=["q", "k", "v", "mask"])
    split = split_forward_backward(trace, ())
    forward, backward = split.forward.python(), split.backward.python()
    assert "_scaled_dot_product_efficient_attention.default" in forward
    assert "_scaled_dot_product_efficient_attention_backward.default" in backward
    assert "softmax" not in backward


def test_cuda_attention_pads_a_mask_whose_rows_the_efficient_kernel_cannot_read():
    # The kernel needs the bias's strides to be multiples of 16 bytes (eager SDPA pads the mask);
    # a (2, 1, 16, 9) mask's are not: "attn_bias is not correctly aligned" where eager runs.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from thunder_core.autodiff.joint import split_forward_backward
    from thunder_core.capture.capture import capture

    with FakeTensorMode():
        q = torch.empty(2, 4, 16, 8, device="cuda", requires_grad=True)
        k, v = (torch.empty(2, 4, 9, 8, device="cuda", requires_grad=True) for _ in range(2))
        mask = torch.empty(2, 1, 16, 9, device="cuda")

    def attention(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    trace, _ = capture(attention, (q, k, v, mask), {}, positional_names=["q", "k", "v", "mask"])
    split = split_forward_backward(trace, ())
    (call,) = [b for b in split.forward.bound_symbols if "efficient_attention" in b.symbol.name]
    bias = call.args[3]
    assert tuple(bias.shape) == (2, 4, 16, 9)
    assert bias.stride()[-1] == 1 and all(s % 16 == 0 for s in bias.stride()[:-1]), bias.stride()


def test_the_attention_bias_is_aligned_on_the_tensor_the_kernel_gets():
    # Whatever layout the executors before it gave the mask (a contiguous (2, 1, 16, 9) one: rows
    # of 36 bytes), the bias is aligned when the program runs, with the mask's values.
    from thunder_core.autodiff.kernels import attention_bias

    for mask in (torch.randn(2, 1, 16, 9), torch.randn(16, 9), torch.randn(2, 1, 16, 32)[..., :9]):
        bias = attention_bias.impl(mask, (2, 4, 16, 9))
        assert all(s % 16 == 0 for s in bias.stride()[:-1]) and bias.stride()[-1] == 1, bias.stride()
        assert torch.equal(bias, mask.expand(2, 4, 16, 9))
    aligned = torch.randn(2, 1, 16, 16)
    assert attention_bias.impl(aligned, (2, 4, 16, 16)).data_ptr() == aligned.data_ptr()  # no copy


def test_a_learned_attention_bias_gets_eagers_gradient():
    def attention(q, k, v, bias):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum()

    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 1, 8, 8, requires_grad=True)
    expected = torch.autograd.grad(attention(q, k, v, bias), (q, k, v, bias))
    actual = torch.autograd.grad(thunder_core.jit(attention)(q, k, v, bias), (q, k, v, bias))
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)
