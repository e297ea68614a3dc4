"""A model's repeated blocks are transformed and compiled once per distinct block."""

from __future__ import annotations

import pytest
import torch
from models import hf_llama, litgpt_gpt, token_batch
from torch import nn

import thunder_core
from thunder_core.jit import pipeline


def _lowerings(monkeypatch) -> list:
    """Every trace handed to executor claiming and fusion, in order."""
    lowered = []
    real = pipeline._lower

    def spy(trace, job):
        lowered.append(trace.function_name)
        return real(trace, job)

    monkeypatch.setattr(pipeline, "_lower", spy)
    return lowered


def _train_step(model, idx, **jit_options):
    jmodel = thunder_core.jit(model, **jit_options)
    logits = jmodel(idx[:, :-1])
    logits = logits if isinstance(logits, torch.Tensor) else logits.logits
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    return jmodel, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _eager_step(model, idx):
    logits = model(idx[:, :-1])
    logits = logits if isinstance(logits, torch.Tensor) else logits.logits
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("build", [lambda: litgpt_gpt(4), lambda: hf_llama(4)], ids=["litgpt", "llama"])
def test_a_transformer_compiles_its_layer_once_with_unchanged_results_and_gradients(build, monkeypatch):
    idx = token_batch(2, 17)
    torch.manual_seed(0)
    model = build()
    reference = build()
    reference.load_state_dict(model.state_dict())
    unshared = build()
    unshared.load_state_dict(model.state_dict())

    lowered = _lowerings(monkeypatch)
    jmodel, loss, grads = _train_step(model, idx)
    assert lowered.count("forward") == 2 and lowered.count("backward") == 2  # one block + the rest, each
    blocks = thunder_core.last_blocks(jmodel)
    assert [(b.calls, bool(b.backward_traces)) for b in blocks] == [(4, True)]
    forward_source = thunder_core.last_traces(jmodel)[
        len(jmodel._forward.last_compiled().traces) - 1
    ].python()
    backward_source = thunder_core.last_backward_traces(jmodel)[-1].python()
    assert forward_source.count(f"= _{blocks[0].name}_forward(") == 4
    assert backward_source.count(f"= _{blocks[0].name}_backward(") == 4
    explanation = str(thunder_core.explain(jmodel))
    assert explanation.count(f"a call of {blocks[0].name} ") == 8  # 4 forward, 4 backward

    _, unshared_loss, unshared_grads = _train_step(unshared, idx, reuse_blocks=False)
    eager_loss, eager_grads = _eager_step(reference, idx)
    torch.testing.assert_close(loss, unshared_loss)
    torch.testing.assert_close(loss, eager_loss)
    for name in grads:
        torch.testing.assert_close(grads[name], unshared_grads[name], msg=name)
        torch.testing.assert_close(grads[name], eager_grads[name], rtol=1e-4, atol=1e-5, msg=name)


class _Residual(nn.Module):
    """x + mlp(norm(x)); the activation is a per-layer choice read in forward."""

    def __init__(self, dim: int, hidden: int, gelu: bool):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.gelu = gelu

    def forward(self, x):
        h = self.up(self.norm(x))
        h = nn.functional.gelu(h) if self.gelu else torch.relu(h)
        return x + self.down(h)


class _Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(_Residual(16, hidden, gelu) for hidden, gelu in layers)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_layers_that_differ_in_shapes_or_code_path_compile_once_per_distinct_block(monkeypatch):
    torch.manual_seed(0)
    layers = [(32, True), (32, False), (32, True), (64, True), (32, False), (64, True)]
    model = _Stack(layers)
    x = torch.randn(3, 5, 16, requires_grad=True)
    lowered = _lowerings(monkeypatch)
    jmodel = thunder_core.jit(model)
    out = jmodel(x)
    out.sum().backward()
    blocks = thunder_core.last_blocks(jmodel)
    assert sorted(b.calls for b in blocks) == [2, 2, 2]
    assert len(lowered) == 2 * (len(blocks) + 1)

    got = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    expected_out = model(x)
    expected_out.sum().backward()
    torch.testing.assert_close(out, expected_out)
    for g, p in zip(got, [*model.parameters(), x]):
        torch.testing.assert_close(g, p.grad)


def test_a_layer_config_changed_between_calls_recompiles_with_other_blocks():
    torch.manual_seed(0)
    model = _Stack([(32, True)] * 3)
    jmodel = thunder_core.jit(model)
    x = torch.randn(2, 16, requires_grad=True)  # else the first layer needs no input gradient: another block
    torch.testing.assert_close(jmodel(x), model(x))
    assert [b.calls for b in thunder_core.last_blocks(jmodel)] == [3]
    model.layers[1].gelu = False  # a per-layer value the forward reads
    torch.testing.assert_close(jmodel(x), model(x))
    assert sorted(b.calls for b in thunder_core.last_blocks(jmodel)) == [1, 2]


def test_inference_shares_blocks_and_matches_eager():
    torch.manual_seed(0)
    model = litgpt_gpt(3).eval()
    idx = token_batch(2, 9)
    jmodel = thunder_core.jit(model)
    with torch.no_grad():
        out = jmodel(idx)
        expected = model(idx)
    torch.testing.assert_close(out, expected)
    blocks = thunder_core.last_blocks(jmodel)
    assert [(b.calls, b.backward_traces) for b in blocks] == [(3, [])]
    assert thunder_core.last_traces(jmodel)[-1].python().count(f"_{blocks[0].name}(") == 3


def test_reuse_blocks_false_and_small_repeated_modules_compile_the_flat_program():
    torch.manual_seed(0)
    model = litgpt_gpt(2)
    idx = token_batch(1, 9)
    jmodel = thunder_core.jit(model, reuse_blocks=False)
    torch.testing.assert_close(jmodel(idx), model(idx))
    assert thunder_core.last_blocks(jmodel) == []

    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())  # leaf modules: no blocks
    jmlp = thunder_core.jit(mlp)
    x = torch.randn(2, 8)
    torch.testing.assert_close(jmlp(x), mlp(x))
    assert thunder_core.last_blocks(jmlp) == []


class _Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return torch.tanh(self.inner(x)) * 2 + 1


def test_a_block_that_mutates_a_buffer_runs_inlined_and_mutates_it_every_call():
    import copy

    model = nn.Sequential(_Counting(), _Counting())
    eager = copy.deepcopy(model)
    jmodel = thunder_core.jit(model)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jmodel(x), eager(x))
    assert [float(m.calls) for m in model] == [float(m.calls) for m in eager] == [3.0, 3.0]
    assert thunder_core.last_blocks(jmodel) == []


class _Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.drop(torch.relu(self.fc(x)))


def test_random_ops_in_blocks_draw_in_the_same_order_as_the_flat_program():
    torch.manual_seed(0)
    model = nn.Sequential(*[_Dropping() for _ in range(3)]).train()
    x = torch.randn(4, 8, requires_grad=True)
    results, jitted = [], []
    for reuse in (True, False):
        jmodel = thunder_core.jit(model, reuse_blocks=reuse)
        torch.manual_seed(1)
        out = jmodel(x)
        (grad,) = torch.autograd.grad(out.sum(), x)
        results.append((out, grad))
        jitted.append(jmodel)
    assert [b.calls for b in thunder_core.last_blocks(jitted[0])] == [3]
    torch.manual_seed(1)
    expected = model(x)
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    torch.testing.assert_close(results[0][0], expected)


def test_ambient_autocast_is_recorded_in_the_blocks():
    # capture records autocast's casts, so the blocks hold them: the first layer casts its
    # float32 input, the second receives bfloat16 (two distinct blocks, as the dtypes say)
    torch.manual_seed(0)
    model = _Stack([(32, True)] * 3)
    x = torch.randn(2, 16)
    jmodel = thunder_core.jit(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = jmodel(x)
        expected = model(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    assert sorted(b.calls for b in thunder_core.last_blocks(jmodel)) == [1, 2]


class _SignedZero(nn.Module):
    def __init__(self, zero: float):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.zero = zero

    def forward(self, x):
        return 1 / (torch.relu(self.fc(x)) * 0 + self.zero) + torch.tanh(x) * 2 - x


def test_constants_that_are_equal_but_not_the_same_make_distinct_blocks():
    model = nn.Sequential(_SignedZero(0.0), _SignedZero(-0.0), _SignedZero(0.0))
    jmodel = thunder_core.jit(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        out, expected = jmodel(x), model(x)
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    torch.testing.assert_close(out, expected, equal_nan=True)
    assert sorted(b.calls for b in thunder_core.last_blocks(jmodel)) == [1, 2]  # -0.0 is not 0.0


class _MaskedLayer(nn.Module):
    """Attention with a boolean mask, as Hugging Face layers take it: the same mask every layer."""

    def __init__(self, width: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, x, mask):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return x + self.out(y.transpose(1, 2).reshape(b, s, w))


class _MaskedStack(nn.Module):
    def __init__(self, layers: int = 3, mask_per_layer: str = "shared"):
        super().__init__()
        self.layers = nn.ModuleList(_MaskedLayer() for _ in range(layers))
        self.mask_per_layer = mask_per_layer

    def forward(self, x):
        s = x.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        mask[:, 0] = True  # no fully masked row once the mask is inverted
        for layer in self.layers:
            # "copies": an equal mask, another tensor each layer; "updated": the one mask, inverted
            # in place between layers (computed once, every layer would see the first mask)
            x = layer(x, mask.clone() if self.mask_per_layer == "copies" else mask)
            if self.mask_per_layer == "updated":
                mask.logical_not_()
        return x


def _masked_stack_step(mask_per_layer: str, grad: bool = True):
    torch.manual_seed(0)
    model = _MaskedStack(mask_per_layer=mask_per_layer)
    reference = _MaskedStack(mask_per_layer=mask_per_layer)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 32)
    x_ref = x.clone().requires_grad_(grad)
    x.requires_grad_(grad)  # every layer's input requires grad: one block
    jmodel = thunder_core.jit(model)
    with torch.set_grad_enabled(grad):
        out, expected = jmodel(x), reference(x_ref)
    torch.testing.assert_close(out, expected)
    if grad:
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        for (name, p), r in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, r.grad, msg=name)
    return jmodel


def test_what_every_call_of_a_block_computes_alike_is_computed_once():
    jmodel = _masked_stack_step("shared")
    (block,) = thunder_core.last_blocks(jmodel)
    assert block.calls == 3
    # autodiff's attention rule makes the boolean mask additive (zeros, masked_fill): once, not per layer
    invariants = str(block.invariant_traces[-1])
    assert "masked_fill" in str(block.invariant_traces[0]), invariants
    assert "masked_fill" not in str(block.traces[-1]) and "masked_fill" not in str(block.traces[-2])
    backward = thunder_core.last_backward_traces(jmodel)
    forward = str(thunder_core.last_traces(jmodel)[-len(backward) - 1])
    assert forward.count(f"{block.name}_invariants(") == 1 and forward.count(f"{block.name}_forward(") == 3


@pytest.mark.parametrize("grad", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("mask_per_layer", ["copies", "updated"])
def test_a_value_that_differs_between_calls_stays_in_the_block(mask_per_layer, grad):
    jmodel = _masked_stack_step(mask_per_layer, grad)
    assert all(block.invariant_traces == [] for block in thunder_core.last_blocks(jmodel))
