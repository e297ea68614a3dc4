"""The inductor executor: regions, deduplicated compiles, and real models against eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import thunder_core


def block(x, w):
    h = F.silu(x) * x
    return F.layer_norm(h + 1, (x.shape[-1],)) @ w


def test_neighbours_become_one_compiled_region_and_matmul_stays_with_torch():
    x, w = torch.randn(8, 32), torch.randn(32, 32)
    jfn = thunder_core.jit(block, executors=["inductor"])
    torch.testing.assert_close(jfn(x, w), block(x, w))
    final = thunder_core.last_traces(jfn)[-1]
    executors = [b.executor for b in final.bound_symbols if b.executor != "python"]
    assert executors == ["inductor", "torch"]
    report = thunder_core.explain(jfn).for_symbol("torch.matmul")[0]
    assert report.executor == "torch" and "no implementation" in report.declined["inductor"]


def test_identical_regions_compile_once():
    def two_layers(x):
        for _ in range(2):
            x = F.gelu(x * 2 + 1).softmax(-1) @ torch.eye(16)
        return x

    jfn = thunder_core.jit(two_layers, executors=["inductor"])
    x = torch.randn(4, 16)
    torch.testing.assert_close(jfn(x), two_layers(x))
    executor = thunder_core.plugins.manager.plugin_manager().plugins["inductor"].executors[0]
    regions = [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]
    assert len(regions) == 2 and regions[0].impl is regions[1].impl
    assert len(executor._compiled) >= 1


def test_litgpt_training_step_matches_eager():
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(
        name="inductor-test", block_size=32, vocab_size=128, padded_vocab_size=128, n_layer=2, n_head=4,
        n_query_groups=4, n_embd=64, intermediate_size=128, bias=False, norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, 128, (2, 17))

    def loss(m):
        logits = m(idx[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))

    expected = loss(model)
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    actual = loss(thunder_core.jit(model, executors=["inductor"]))
    actual.backward()
    torch.testing.assert_close(actual, expected)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-5, msg=n)
