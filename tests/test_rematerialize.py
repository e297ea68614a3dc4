"""Rematerialization saves the fewest bytes the backward can recompute its reads from, and keeps
what a matmul reads in both passes (recomputing it would write it to memory once more)."""

from __future__ import annotations

import pytest
import torch

import thunder_core
from thunder_core.extend import RECOMPUTE, Symbol, new_tensor_proxy
from thunder_core.ir.proxies import TensorProxy

ROWS, WIDTH, OUT = 32, 64, 48


def _norm_then_linear(x, norm_weight, projection):
    """RMSNorm (as Llama writes it: casts, mean of squares, rsqrt) feeding a linear layer."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    normed = norm_weight * h.to(x.dtype)
    return normed @ projection


def _inputs():
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(ROWS, WIDTH, generator=g, requires_grad=True),
        torch.randn(WIDTH, generator=g, requires_grad=True),
        torch.randn(WIDTH, OUT, generator=g, requires_grad=True),
    )


def _executed_forward(fn):
    """The forward trace the last call ran (the traces after it are the backward's)."""
    return thunder_core.last_traces(fn)[-len(thunder_core.last_backward_traces(fn)) - 1]


def _saved_and_forward(fn):
    inputs = _inputs()
    fn(*inputs).sum().backward()
    forward = _executed_forward(fn)
    saved = [p for p in forward.output[1] if isinstance(p, TensorProxy)]
    return saved, forward, {p.name for p in forward.inputs}


def test_the_normalized_activation_is_recomputed_and_the_matmul_operand_saved():
    jitted = thunder_core.jit(_norm_then_linear)
    saved, forward, inputs = _saved_and_forward(jitted)
    computed = [p for p in saved if p.name not in inputs]
    matmul = next(b for b in forward.bound_symbols if b.symbol.name == "matmul")
    operand = matmul.args[0].name
    # The operand ``norm_weight * h`` is saved; ``h`` (read by the backward only to sum the weight's
    # gradient, fused) is recomputed from the input and the per-row rsqrt, through a chain of casts.
    assert operand in {p.name for p in computed}
    full_size = [p for p in computed if tuple(p.shape) == (ROWS, WIDTH)]
    assert [p.name for p in full_size] == [operand], [str(p) for p in computed]
    assert all(tuple(p.shape) in {(ROWS, WIDTH), (ROWS, 1)} for p in computed)


def test_gradients_match_eager_with_the_recomputed_values():
    expected_inputs, actual_inputs = _inputs(), _inputs()
    _norm_then_linear(*expected_inputs).square().sum().backward()
    thunder_core.jit(_norm_then_linear)(*actual_inputs).square().sum().backward()
    for expected, actual in zip(expected_inputs, actual_inputs):
        torch.testing.assert_close(actual.grad, expected.grad)


def _gated_mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down


def test_a_gated_product_both_passes_read_is_saved_not_recomputed():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, WIDTH, generator=g)
    weights = [torch.randn(*shape, generator=g, requires_grad=True) for shape in ((WIDTH, OUT), (WIDTH, OUT))]
    down = torch.randn(OUT, WIDTH, generator=g, requires_grad=True)
    jitted = thunder_core.jit(_gated_mlp)
    jitted(x, *weights, down).sum().backward()
    forward = _executed_forward(jitted)
    saved = {p.name for p in forward.output[1] if isinstance(p, TensorProxy)}
    matmuls = [b for b in forward.bound_symbols if b.symbol.name == "matmul"]
    product = matmuls[-1].args[0].name  # the down projection's operand
    gate_out, up_out = (m.output.name for m in matmuls[:2])
    # silu(gate) * up feeds the down projection and its weight's gradient: saved, as are the two
    # projections the gate's backward reads; silu(gate) itself is recomputed (fused) from gate_out.
    assert {product, gate_out, up_out} <= saved
    expected = [w.detach().clone().requires_grad_() for w in (*weights, down)]
    _gated_mlp(x, *expected).sum().backward()
    for e, a in zip(expected, (*weights, down)):
        torch.testing.assert_close(a.grad, e.grad)


def _update_after_use(x, b, w):
    c = b.sin()
    a = (c + x).exp()  # recomputing ``a`` from ``c`` in the backward would read the update below
    y = (a * w).sum()
    c.mul_(2)
    return y + c.sum()


def _update_input_after_use(x, b, w):
    a = (b + 1).exp()
    y = (a * w).sum()
    b.mul_(2)
    return y


def _constants_only(x, b, w):
    return (w * (torch.zeros(4) + 2)).sum()


@pytest.mark.parametrize("fn", [_update_after_use, _update_input_after_use, _constants_only])
def test_values_updated_in_place_later_are_not_recomputed_from(fn):
    grads = []
    for run in (fn, thunder_core.jit(fn)):
        b, w = torch.linspace(-1, 1, 4), torch.ones(4, requires_grad=True)
        run(torch.randn(4, generator=torch.Generator().manual_seed(0)), b, w).backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[1], grads[0])


def test_an_op_tagged_recompute_is_recomputed_even_where_a_matmul_reads_it():
    # As FSDP's gather of a sharded weight: read by the linear in both passes, gathered again.
    def meta(shard, rows):
        return new_tensor_proxy((rows, *shard.shape[1:]), shard.dtype, shard.device, shard.requires_grad)

    def vjp(shard, rows):
        return gather(shard, rows), lambda g: [(shard, g)]

    gather = Symbol(
        "gather_again_for_test", lambda shard, rows: shard.clone(), "gather_again_for_test",
        meta=meta, tags=frozenset({RECOMPUTE}), vjp=vjp,
    )  # fmt: skip

    def f(x, shard):
        return torch.nn.functional.linear(x, gather(shard, shard.shape[0])).tanh().sum()

    x, shard = torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    jitted = thunder_core.jit(f)
    jitted(x, shard).backward()
    assert "gather_again_for_test" in str(thunder_core.last_backward_traces(jitted)[-1])
    expected = [t.detach().clone().requires_grad_() for t in (x, shard)]
    torch.nn.functional.linear(expected[0], expected[1].clone()).tanh().sum().backward()
    torch.testing.assert_close(x.grad, expected[0].grad)
    torch.testing.assert_close(shard.grad, expected[1].grad)
