"""The inductor executor: regions, deduplicated compiles, and real models against eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import thunder_core
from thunder_core.testing.models import check_litgpt_training


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
    regions = [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]
    assert len(regions) == 2 and regions[0].impl is regions[1].impl


def test_litgpt_training_step_matches_eager():
    check_litgpt_training(["inductor"])
