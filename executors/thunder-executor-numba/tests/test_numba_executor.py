"""The numba executor: what it fuses, how it caches, and that results match eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import thunder_core
from thunder_core.testing import plugin_info
from thunder_core.testing.models import check_litgpt_training


def _fused(jfn):
    return [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "numba"]


def chain(x, w, b):
    return F.gelu(x * w + b) * 0.5 + x


def test_elementwise_chain_is_one_flat_parallel_kernel():
    x, w, b = (torch.randn(1 << 16) for _ in range(3))
    jfn = thunder_core.jit(chain, executors=["numba"])
    torch.testing.assert_close(jfn(x, w, b), chain(x, w, b))
    (region,) = _fused(jfn)
    assert "numba.prange(65536)" in region.impl.source and "erf32(" in region.impl.source


def rms_norm(x, w):
    xf = x.float()
    return xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + 1e-5) * w


def test_row_reductions_fuse_into_multi_pass_row_kernels():
    x, w = torch.randn(4, 64, 256), torch.randn(256)
    for fn, args, passes in [
        (rms_norm, (x, w), 2),
        (lambda x: x.softmax(-1), (x,), 3),
        (lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, torch.randn(256)), 3),
    ]:
        jfn = thunder_core.jit(fn, executors=["numba"])
        torch.testing.assert_close(jfn(*args), fn(*args))
        (region,) = _fused(jfn)
        assert region.impl.source.count("for c in range(256)") == passes


def test_a_vector_is_read_per_column_even_when_rows_and_columns_have_the_same_length():
    # On a square (5, 5) iteration shape a (5,) value could be per row or per column: only the
    # broadcast says which. Reading it per row would sum the wrong entries.
    def column_scaled_sums(v, g):
        return (g * torch.log(v.abs() + 1)).sum(1), g * (v * 2)

    options = {"numba": {"min_region_size": 1}}
    for v, g in [(torch.randn(5), torch.randn(5, 5)), (torch.randn(7), torch.randn(5, 7))]:
        jfn = thunder_core.jit(column_scaled_sums, executors=["numba"], options=options)
        torch.testing.assert_close(jfn(v, g), column_scaled_sums(v, g))
        assert _fused(jfn)


def test_training_backward_fuses_too_and_matches_eager():
    x = torch.randn(8, 128, requires_grad=True)
    w = torch.randn(128, requires_grad=True)

    def loss(x, w):
        return (F.silu(rms_norm(x, w)) * x).softmax(-1).sum()

    jfn = thunder_core.jit(loss, executors=["numba"])
    (gx, gw) = torch.autograd.grad(jfn(x, w), (x, w))
    (ex, ew) = torch.autograd.grad(loss(x, w), (x, w))
    torch.testing.assert_close((gx, gw), (ex, ew))
    backward = thunder_core.last_backward_traces(jfn)[-1]
    assert any(b.executor == "numba" for b in backward.bound_symbols)


def test_each_region_signature_compiles_once():
    jfn = thunder_core.jit(chain, executors=["numba"])
    x, w, b = (torch.randn(1000) for _ in range(3))
    jfn(x, w, b)
    executor = plugin_info("numba").executors[0]
    kernels = len(executor._kernels)
    other = thunder_core.jit(lambda x, w, b: chain(x, w, b), executors=["numba"])  # same region
    torch.testing.assert_close(other(x, w, b), chain(x, w, b))
    assert len(executor._kernels) == kernels


def test_declines_what_it_does_not_generate_with_reasons():
    jfn = thunder_core.jit(lambda a, b: (a + b) * 2, executors=["numba"])
    a = torch.arange(6)
    torch.testing.assert_close(jfn(a, a), (a + a) * 2)
    (report,) = thunder_core.explain(jfn).for_symbol("torch.add")
    assert report.executor == "torch"
    assert "float32, float64 and bool" in report.declined["numba"]


def test_regions_that_do_not_fit_go_back_to_torch():
    def fn(x, y):  # a reduction over a leading dim does not fuse with the rest
        return (x * 2).sum(0) + y

    x, y = torch.randn(16, 8), torch.randn(8)
    jfn = thunder_core.jit(fn, executors=["numba"])
    torch.testing.assert_close(jfn(x, y), fn(x, y))


def test_litgpt_training_step_matches_eager():
    check_litgpt_training(["numba"])


def _claimed_linears(jfn) -> list:
    return [b for b in _fused(jfn) if any(s.symbol.name == "linear" for s in b.subsymbols)]


def test_one_row_linear_runs_as_the_matrix_vector_kernel():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for bias in (True, False):
            layer = torch.nn.Linear(384, 512, bias=bias).to(dtype).eval()
            jlayer = thunder_core.jit(layer, executors=["numba"])
            for shape in [(384,), (1, 384), (1, 1, 384)]:
                x = torch.randn(shape, dtype=dtype)
                with torch.no_grad():  # another rank recompiles: its regions compile at its second call
                    for _ in range(2):
                        torch.testing.assert_close(jlayer(x), layer(x))
                (region,) = _claimed_linears(jlayer)
                assert region.impl.source.startswith("numba gemv")


def test_the_matrix_vector_kernel_propagates_nan_and_infinity_like_eager():
    layer = torch.nn.Linear(384, 512).eval()
    with torch.no_grad():
        layer.weight[3, 7] = float("nan")
        layer.weight[5, 0] = float("inf")
    jlayer = thunder_core.jit(layer, executors=["numba"])
    x = torch.randn(1, 384)
    with torch.no_grad():
        out, expected = jlayer(x), layer(x)
    assert _claimed_linears(jlayer)
    torch.testing.assert_close(out, expected, equal_nan=True)


def test_linear_stays_with_aten_for_several_rows_training_and_small_weights():
    layer = torch.nn.Linear(384, 512)
    x = torch.randn(1, 384)
    cases = [
        (layer, torch.randn(2, 384), torch.no_grad, "more than one input row"),
        (layer, x, torch.enable_grad, "inference only"),
        (torch.nn.Linear(64, 64), torch.randn(1, 64), torch.no_grad, "below"),
    ]
    for module, inp, mode, reason in cases:
        jmodule = thunder_core.jit(module, executors=["numba"])
        with mode():
            torch.testing.assert_close(jmodule(inp), module(inp))
        assert not _claimed_linears(jmodule)
        assert reason in str(thunder_core.explain(jmodule))


def test_litgpt_decoding_with_the_matrix_vector_kernel_matches_eager():
    import copy

    from thunder_core.testing.models import small_litgpt

    torch.manual_seed(0)
    model = small_litgpt(2, 256, 512, 64, n_query_groups=2).eval()
    twin = copy.deepcopy(model)
    prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.set_kv_cache(batch_size=1)
        twin.set_kv_cache(batch_size=1)
        jmodel = thunder_core.jit(model, executors=["numba"])
        input_pos = torch.arange(8)
        token = prompt
        for _ in range(8):
            logits = jmodel(token, input_pos)
            torch.testing.assert_close(logits, twin(token, input_pos), rtol=1e-4, atol=1e-4)
            token = logits[:, -1:].argmax(-1)
            input_pos = input_pos[-1:] + 1
    assert (
        len(_claimed_linears(jmodel)) == 2 * 5 + 1
    )  # qkv, attention proj, fc_1, fc_2, mlp proj per layer; lm_head
    assert len(_claimed_attention(jmodel)) == 2  # one per layer, over the grouped-query cache


def _claimed_attention(jfn) -> list:
    return [b for b in _fused(jfn) if b.subsymbols[0].symbol.name == "scaled_dot_product_attention"]


def _attend(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=0.125)


def test_one_query_attention_over_a_masked_cache_skips_masked_positions_and_matches_eager():
    """Prefixes of a 512-position cache (none, some, all filled), scattered masks, per-head masks,
    an expanded (grouped-query) cache, float32 and float64; every position masked gives eager's zeros."""
    torch.manual_seed(0)
    jfn = thunder_core.jit(_attend, executors=["numba"], dynamic=False)  # Numba's kernel per mask shape
    for dtype in (torch.float32, torch.float64):
        q = torch.randn(1, 8, 1, 64, dtype=dtype)
        k, v = torch.randn(1, 8, 512, 64, dtype=dtype), torch.randn(1, 8, 512, 64, dtype=dtype)
        grouped = torch.randn(1, 2, 1, 512, 64, dtype=dtype).expand(1, 2, 4, 512, 64).reshape(1, 8, 512, 64)
        masks = [torch.arange(512) < n for n in (0, 1, 37, 512)]
        masks += [torch.rand(512) < 0.3, torch.rand(1, 8, 1, 512) < 0.5]
        for mask in masks:
            for keys in (k, grouped):
                mask4 = mask.view(1, 1, 1, 512) if mask.ndim == 1 else mask
                for _ in range(2):  # a recompile compiles its regions at its second call
                    with torch.no_grad():
                        out = jfn(q, keys, v, mask4)
                    torch.testing.assert_close(out, _attend(q, keys, v, mask4), equal_nan=True)
                (region,) = _claimed_attention(jfn)
                assert region.impl.source.startswith("numba attention")
    with torch.no_grad():
        nothing_to_attend = jfn(q, k, v, torch.zeros(1, 1, 1, 512, dtype=torch.bool))
    assert _claimed_attention(jfn) and not nothing_to_attend.isnan().any()
    torch.testing.assert_close(
        nothing_to_attend, _attend(q, k, v, torch.zeros(1, 1, 1, 512, dtype=torch.bool))
    )


def test_attention_stays_with_aten_when_the_kernel_does_not_fit():
    q, k, v = torch.randn(1, 4, 1, 32), torch.randn(1, 4, 64, 32), torch.randn(1, 4, 64, 32)
    mask = torch.ones(1, 1, 1, 64, dtype=torch.bool)
    cases = [
        (lambda: (torch.randn(1, 4, 2, 32), k, v, mask), torch.no_grad, "one query row"),
        (lambda: (q, k, v, torch.zeros(1, 1, 1, 64)), torch.no_grad, "boolean attn_mask"),
        (lambda: (q.requires_grad_(), k, v, mask), torch.enable_grad, None),  # training: ATen's kernels
    ]
    for make, mode, reason in cases:
        args = make()
        jfn = thunder_core.jit(_attend, executors=["numba"])
        with mode():
            torch.testing.assert_close(jfn(*args), _attend(*args))
        assert not _claimed_attention(jfn)
        assert reason is None or reason in str(thunder_core.explain(jfn)), reason


_LAZY_IMPORT = """
import json, sys
import torch
import thunder_core

x = torch.randn(1 << 16)
add = thunder_core.jit(lambda a, b: a + b)  # the default executors, Numba among them
same = torch.equal(add(x, x), x + x)
before = "numba" in sys.modules
chain = thunder_core.jit(lambda a: (a * 2 + 1).sin(), executors=["numba"])
same = same and torch.allclose(chain(x), (x * 2 + 1).sin())
ran = [b.executor for b in thunder_core.last_traces(chain)[-1].bound_symbols if b.executor == "numba"]
print(json.dumps({"same": same, "before": before, "after": "numba" in sys.modules, "ran": ran}))
"""


def test_numba_is_imported_when_its_first_region_compiles_not_when_the_plugin_is_found():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LAZY_IMPORT], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "before": False, "after": True, "ran": ["numba"]}
