"""Complex numbers forward and backward: rotary embeddings written as Meta's reference Llama
writes them (``torch.polar``, ``view_as_complex``, ``view_as_real``), complex inputs and FFTs give
eager's values and gradients with each executor list and through torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import thunder_core

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]
FRONT_ENDS = ["jit-torch", "jit-default", "torch.compile"]


def compiled(fn, front_end):
    if front_end == "torch.compile":
        torch._dynamo.reset()
        return torch.compile(fn, backend="thunder_core")
    return thunder_core.jit(fn, executors=["torch"] if front_end == "jit-torch" else DEFAULT_EXECUTORS)


# Rotary embeddings as in Meta's reference Llama (llama/model.py).
def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(nn.Module):
    def __init__(self, dim=32, n_heads=4, max_len=16):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.freqs_cis = precompute_freqs_cis(self.head_dim, max_len)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        q, k = apply_rotary_emb(q, k, self.freqs_cis[:seqlen])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        out = torch.matmul(torch.softmax(scores.float(), dim=-1).type_as(q), v)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_reference_llama_rotary_attention_values_and_gradients(front_end):
    torch.manual_seed(0)
    model = Attention()
    cmodel = compiled(model, front_end)
    for seqlen in (8, 8, 5):
        x = torch.randn(2, seqlen, 32, requires_grad=True)
        expected = model(x)
        expected_grads = torch.autograd.grad(expected.square().sum(), [x, *model.parameters()])
        actual = cmodel(x)
        actual_grads = torch.autograd.grad(actual.square().sum(), [x, *model.parameters()])
        torch.testing.assert_close(actual, expected)
        for a, e in zip(actual_grads, expected_grads):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def polar_and_back(r, theta):
    z = torch.polar(r, theta) * (1 + 2j)
    return torch.view_as_real(z).sum(-1) + z.abs() + torch.angle(z)


def complex_input(z, w):
    y = z * w.conj() + torch.exp(z)
    return (y * y).real.sum() + y.abs().sum()


def spectrum(x):
    return torch.fft.irfft(torch.fft.rfft(x) * 0.5, n=x.shape[-1]) + torch.fft.rfft(x).abs().sum()


CASES = {
    "polar": (polar_and_back, lambda: (torch.rand(6) + 0.5, torch.randn(6))),
    "complex inputs": (
        complex_input,
        lambda: (torch.randn(5, dtype=torch.complex64), torch.randn(5, dtype=torch.complex64)),
    ),
    "fft": (spectrum, lambda: (torch.randn(3, 8),)),
}


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("case", CASES)
def test_complex_values_and_gradients(case, front_end):
    fn, make_args = CASES[case]
    cfn = compiled(fn, front_end)
    for _ in range(2):
        torch.manual_seed(1)
        args = [a.requires_grad_() for a in make_args()]
        expected = fn(*args)
        expected_grads = torch.autograd.grad(expected.sum(), args)
        actual = cfn(*args)
        actual_grads = torch.autograd.grad(actual.sum(), args)
        torch.testing.assert_close(actual, expected)
        for a, e in zip(actual_grads, expected_grads):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
