"""The ops transformer models use: each is a symbol whose decomposition into prims matches eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_core
from thunder_core.ir.interpret import eval_trace

torch.manual_seed(0)
X = torch.randn(2, 4, 8)
W = torch.randn(16, 8)
IDX = torch.randint(0, 10, (2, 5))
Q = torch.randn(2, 4, 6, 8)

CASES = {
    "linear": (lambda x, w: F.linear(x, w), (X, W)),
    "matmul": (lambda x, w: x @ w.t(), (X, W)),
    "bmm": (lambda a: torch.bmm(a, a.transpose(1, 2)), (X,)),
    "embedding": (lambda i, w: F.embedding(i, w), (IDX, torch.randn(10, 8))),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b), (X, torch.randn(8), torch.randn(8))),
    "rms_norm": (lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6), (X, torch.randn(8))),
    "softmax": (lambda x: x.softmax(-1), (X,)),
    "log_softmax": (lambda x: F.log_softmax(x, dim=1), (X,)),
    "gelu": (lambda x: F.gelu(x, approximate="tanh") + F.gelu(x), (X,)),
    "silu": (F.silu, (X,)),
    "relu": (torch.relu, (X,)),
    "tanh": (torch.tanh, (X,)),
    "sigmoid": (torch.sigmoid, (X,)),
    "scaled_dot_product_attention": (lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), (Q,)),
    "cross_entropy": (
        lambda x, t: F.cross_entropy(x, t, ignore_index=3),
        (torch.randn(6, 10), torch.tensor([1, 3, 5, 7, 9, 0])),
    ),
    "view": (lambda x: x.view(8, 8), (X,)),
    "reshape": (lambda x: x.reshape(-1, 4), (X,)),
    "permute": (lambda x: x.permute(2, 0, 1), (X,)),
    "transpose": (lambda x: x.transpose(1, 2), (X,)),
    "expand": (lambda x: x[:, :1].expand(2, 4, 8), (X,)),
    "unsqueeze": (lambda x: x.unsqueeze(1), (X,)),
    "squeeze": (lambda x: x[:, :1].squeeze(1), (X,)),
    "flatten": (lambda x: x.flatten(1), (X,)),
    "cat": (lambda x: torch.cat([x, x * 2], dim=-1), (X,)),
    "stack": (lambda x: torch.stack([x, x], dim=1), (X,)),
    "split": (lambda x: x.split([3, 5], dim=-1), (X,)),
    "chunk": (lambda x: x.chunk(2, dim=1), (X,)),
    "narrow": (lambda x: x.narrow(2, 1, 4), (X,)),
    "getitem": (lambda x: (x[0, 1:3, ::2], x[..., None, -1], x[:, torch.tensor([0, 2])]), (X,)),
    "where": (lambda x: torch.where(x > 0, x, 0.5), (X,)),
    "masked_fill": (lambda x: x.masked_fill(x < 0, float("-inf")), (X,)),
    "triu": (lambda x: x.triu(1), (X,)),
    "tril": (lambda x: x.tril(), (X,)),
    "arange": (lambda x: x + torch.arange(8), (X,)),
    "zeros": (lambda x: x + torch.zeros(4, 8), (X,)),
    "ones": (lambda x: x + torch.ones(8), (X,)),
    "full": (lambda x: x + torch.full((4, 8), 2.5), (X,)),
    "zeros_like": (lambda x: torch.zeros_like(x) + torch.ones_like(x), (X,)),
    "to": (lambda x: x.to(torch.float64), (X,)),
    "cumsum": (lambda x: x.cumsum(1), (X,)),
    "topk": (lambda x: x.topk(3, dim=-1), (X,)),
    "repeat_interleave": (lambda x: x.repeat_interleave(2, dim=1), (X,)),
    "gather": (lambda x: x.gather(2, torch.zeros(2, 4, 3, dtype=torch.int64)), (X,)),
    "scatter": (lambda x: x.scatter(2, torch.ones(2, 4, 1, dtype=torch.int64), 7.0), (X,)),
    "bitwise_left_shift": (lambda i: (i << 2) + (i >> 1), (IDX,)),
    "add": (lambda x, i: x + 1 - i[0, 0] * 2.5 / 3, (X, IDX)),
    "sum": (lambda x: x.sum((0, 2), keepdim=True), (X,)),
    "mean": (lambda x: x.mean(-1), (X,)),
    "var": (lambda x: x.var(1, unbiased=False), (X,)),
    "amax": (lambda x: x.amax(1), (X,)),
    "argmax": (lambda x: x.argmax(-1), (X,)),
    "dropout": (lambda x: F.dropout(x, 0.0) + F.dropout(x, 0.5, training=False), (X,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_decomposes_into_prims_and_matches_eager(name):
    fn, args = CASES[name]
    jfn = thunder_core.jit(fn)
    expected = fn(*args)
    torch.testing.assert_close(jfn(*args), expected)
    trace = thunder_core.last_traces(jfn)[0]
    torch.testing.assert_close(eval_trace(trace, *args, decompose=True), expected)
    assert name in {b.symbol.name for b in trace.bound_symbols}
    if name != "dropout":  # dropout with p=0 or eval mode is the identity: nothing to decompose
        assert any(b.subsymbols for b in trace.bound_symbols if b.symbol.name == name)
