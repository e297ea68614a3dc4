"""The inductor executor: regions, deduplicated compiles, and real models against eager."""

from __future__ import annotations

import pytest
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
    assert len(regions) == 2 and regions[0].impl.fn is regions[1].impl.fn  # .fn: the compiled region


def test_litgpt_training_step_matches_eager():
    check_litgpt_training(["inductor"])


def test_a_region_of_two_computing_ops_is_compiled_but_one_op_and_views_are_not():
    def mlp_gate(a, b, w):
        gated = F.silu(a) * b  # two ops between matmuls, as in LLaMA's MLP
        single = (gated @ w).reshape(-1).exp()  # one computing op, with a view
        return single

    jfn = thunder_core.jit(mlp_gate, executors=["inductor"])
    a, b, w = torch.randn(8, 16), torch.randn(8, 16), torch.randn(16, 4)
    torch.testing.assert_close(jfn(a, b, w), mlp_gate(a, b, w))
    final = thunder_core.last_traces(jfn)[-1]
    assert [b.executor for b in final.bound_symbols if b.executor != "python"] == [
        "inductor",
        "torch",
        "torch",
        "torch",
    ]
    report = thunder_core.explain(jfn).for_symbol("torch.exp")[0]
    assert "min_region_size" in report.declined["inductor"]


def _forward_region_ops(jfn) -> list[list[str]]:
    backward = thunder_core.last_backward_traces(jfn)
    final = [t for t in thunder_core.last_traces(jfn) if t not in backward][-1]
    return [[s.symbol.name for s in b.subsymbols] for b in final.bound_symbols if b.executor == "inductor"]


def test_claims_separated_by_an_independent_matmul_form_one_region():
    def llama_mlp(x, gate, up, down):  # transformers' LlamaMLP: the up matmul sits between SiLU and product
        return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)

    x = torch.randn(4, 8, 16, requires_grad=True)
    weights = [torch.randn(32, 16, requires_grad=True), torch.randn(32, 16, requires_grad=True)]
    weights.append(torch.randn(16, 32, requires_grad=True))
    jfn = thunder_core.jit(llama_mlp, executors=["inductor"], select="priority")
    out = jfn(x, *weights)
    expected = llama_mlp(x, *weights)
    torch.testing.assert_close(out, expected)
    assert any({"silu", "mul"} <= set(ops) for ops in _forward_region_ops(jfn))
    grads = torch.autograd.grad(out.sum(), [x, *weights])
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), [x, *weights]))


def test_nothing_moves_across_an_in_place_update():
    def update_between(x, w, buffer):
        gated = F.silu(buffer)  # reads the buffer before it is doubled
        buffer.mul_(2)  # in eager the product below reads the doubled buffer
        return (gated * (x @ w)) + buffer

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    buffer, reference = torch.ones(8, 8), torch.ones(8, 8)
    jfn = thunder_core.jit(update_between, executors=["inductor"], select="priority")
    torch.testing.assert_close(jfn(x, w, buffer), update_between(x, w, reference))
    torch.testing.assert_close(buffer, reference)


def test_a_region_called_with_other_strides_than_traced_gets_its_own_variant():
    def fn(x, y):
        return (x * 2 + y).exp()

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    jfn = thunder_core.jit(fn, executors=["inductor"])
    jfn(x, y)
    (region,) = [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]
    transposed = x.t().contiguous().t()  # same values, strides (1, 8) instead of (8, 1)
    (out,) = region.impl(transposed, y)
    torch.testing.assert_close(out, fn(x, y))


MAXIMAL = {"inductor": {"regions": "maximal"}}


def test_maximal_regions_take_matmuls_too():
    x, w = torch.randn(8, 32), torch.randn(32, 32)
    jfn = thunder_core.jit(block, executors=["inductor"], options=MAXIMAL)
    torch.testing.assert_close(jfn(x, w), block(x, w))
    final = thunder_core.last_traces(jfn)[-1]
    assert [b.executor for b in final.bound_symbols if b.executor != "python"] == ["inductor"]
    region = next(b for b in final.bound_symbols if b.executor == "inductor")
    assert "torch.matmul" in {s.symbol.printed_name for s in region.subsymbols}


def test_litgpt_training_step_with_maximal_regions_matches_eager():
    check_litgpt_training(["inductor"], options=MAXIMAL)


def test_litgpt_training_step_measured_against_numba_and_torch_matches_eager():
    """The default selection: each region timed against numba, the rest of the job and torch."""
    check_litgpt_training(["inductor", "numba"], select="measure")


def test_a_maximal_region_is_measured_against_fusion_regions_and_the_rest_of_the_job():
    x, w = torch.randn(8, 32), torch.randn(32, 32)
    jfn = thunder_core.jit(block, executors=["inductor"], options=MAXIMAL, select="measure")
    torch.testing.assert_close(jfn(x, w), block(x, w))
    (region,) = [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]
    timed = region.impl.selection.seconds  # every candidate compiled, ran and was timed
    assert set(timed) == {"inductor", "inductor(fusion)+torch", "torch"}, timed
    note = thunder_core.explain(jfn).for_symbol("torch.matmul")[0].note
    assert "inductor(fusion)+torch" in note
    torch.testing.assert_close(jfn(x, w), block(x, w))  # whichever was kept


def test_litgpt_training_step_with_measured_maximal_regions_matches_eager():
    check_litgpt_training(["inductor", "numba"], options=MAXIMAL, select="measure")


def test_torch_is_measured_only_where_it_does_not_raise_the_programs_peak():
    def row_energy(x):  # op by op: two full-size intermediates for one value per row, at the peak
        return (x.exp() * 2).sum(-1)

    def before_a_larger_product(x, w):  # op by op: 2x the region's output, well below the matmul's
        return (x.exp() * 2) @ w

    def alone(x):  # the region is the program's peak: op by op would hold twice its output
        return x.exp() * 2

    x, w = torch.randn(64, 512), torch.randn(512, 4096)
    for fn, args, torch_measured in (
        (row_energy, (x,), False),
        (before_a_larger_product, (x, w), True),
        (alone, (x,), False),
    ):
        jfn = thunder_core.jit(fn, executors=["inductor"], select="measure")
        torch.testing.assert_close(jfn(*args), fn(*args), atol=1e-3, rtol=1e-4)  # a 512-term sum of exps
        note = thunder_core.explain(jfn).for_symbol("torch.exp")[0].note
        assert ("measured" in note) is torch_measured, (fn.__name__, note)


def test_an_unknown_region_mode_is_refused_with_the_choices():
    import pytest

    with pytest.raises(ValueError, match=r"regions must be one of \('fusion', 'maximal'\)"):
        thunder_core.jit(block, executors=["inductor"], options={"inductor": {"regions": "everything"}})


def test_a_view_updated_in_place_stays_out_of_regions_and_the_region_before_is_measured():
    """The KV-cache pattern: a view of the cache, then index_copy_ writes the new entry through
    it. The view is left to torch (another candidate for a region returning it could return a
    copy, and the update would miss the cache); the region computing the entry, which the
    update only reads, is measured. Results and the cache equal eager's."""

    def step(cache, x, position):
        window = cache[:1, ...]
        entry = torch.sin(x) * 2 + 1
        window.index_copy_(1, position, entry)
        return window.sum() + entry.exp().sum()

    cache, x, position = torch.zeros(2, 8, 4), torch.randn(1, 1, 4), torch.tensor([3])
    expected_cache = cache.clone()
    expected = step(expected_cache, x, position)
    jfn = thunder_core.jit(step, executors=["inductor", "numba"], select="measure")
    with torch.no_grad():
        torch.testing.assert_close(jfn(cache, x, position), expected)
    torch.testing.assert_close(cache, expected_cache)
    explanation = thunder_core.explain(jfn)
    (window_report,) = explanation.for_symbol("torch.Tensor.__getitem__")
    assert window_report.executor == "torch"
    assert "updated in place" in window_report.declined["inductor"], window_report.declined
    (entry_report,) = explanation.for_symbol("torch.sin")
    assert "measured" in entry_report.note, entry_report.note


def test_batch_norm_running_statistics_beside_regions_equal_eager():
    """batch_norm in training updates its running statistics in place; claims read them before
    and after the update."""

    def stats_before_and_after(x, running_mean, running_var):
        before = (running_mean * 2).exp()
        y = F.batch_norm(x, running_mean, running_var, training=True)
        return before + y.mean(0) + running_mean

    x = torch.randn(4, 3)
    mine = (torch.zeros(3), torch.ones(3))
    reference = (torch.zeros(3), torch.ones(3))
    jfn = thunder_core.jit(stats_before_and_after, executors=["inductor"], select="priority")
    torch.testing.assert_close(jfn(x, *mine), stats_before_and_after(x, *reference))
    torch.testing.assert_close(mine, reference)


def _attention_heads(x, w):
    """Heads split by views of a region's result, and a transposed weight for the matmul."""
    h = torch.tanh(x) * 2
    heads = h.view(2, 8, 4, 4).transpose(1, 2)  # views of the region's result
    scores = (h * 3).transpose(1, 2).reshape(2, 128)  # reshape of a non-contiguous tensor: a copy
    return heads, scores @ w.t()


def test_views_of_a_regions_results_run_after_it_with_torch():
    """Returning a view makes each call of an Inductor region rebuild it in Python; views of its
    results (not copies) run after the region, by torch, and give eager's values and aliasing."""
    x, w = torch.randn(2, 8, 16), torch.randn(32, 128)
    jfn = thunder_core.jit(_attention_heads, executors=["inductor"])
    heads, out = jfn(x, w)
    expected_heads, expected = _attention_heads(x, w)
    torch.testing.assert_close(heads, expected_heads)
    torch.testing.assert_close(out, expected)
    assert heads.stride() == expected_heads.stride()
    final = thunder_core.last_traces(jfn)[-1]
    after = [b.symbol.name for b in final.bound_symbols if b.executor == "torch"]
    assert {"view", "transpose", "t"} <= set(after), after  # the heads and the weight's transpose
    (region,) = [b for b in final.bound_symbols if b.executor == "inductor"]
    inside = {s.symbol.name for s in region.subsymbols}
    assert "reshape" in inside and "view" not in inside and "t" not in inside, inside
    heads_transpose, scores_transpose = thunder_core.explain(jfn).for_symbol("torch.transpose")
    assert heads_transpose.executor == "torch" and "run after it" in heads_transpose.declined["inductor"]
    assert scores_transpose.executor == "inductor"  # read inside the region: stays there


def test_views_after_regions_in_training_give_eager_gradients():
    x = torch.randn(2, 8, 16, requires_grad=True)
    w = torch.randn(32, 128, requires_grad=True)
    jfn = thunder_core.jit(_attention_heads, executors=["inductor"])
    heads, out = jfn(x, w)
    (heads.sum() + out.square().sum()).backward()
    ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    expected_heads, expected = _attention_heads(ex, ew)
    (expected_heads.sum() + expected.square().sum()).backward()
    torch.testing.assert_close(out, expected)
    # Inductor's fused tanh backward rounds otherwise than eager's kernels: torch.compile's
    # gradient differs from eager's by the same amount (relative 7e-6 on an AVX-512 CPU)
    torch.testing.assert_close(x.grad, ex.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad, ew.grad, rtol=1e-4, atol=1e-4)


def test_a_region_with_symbolic_sizes_compiles_once_for_every_size():
    """dynamic=True: one Inductor region, compiled once, runs every length; training too."""

    def head(x, w):
        return F.gelu(x @ w).softmax(-1).reshape(x.shape[0] // 2, -1).sum(-1)

    w = torch.randn(16, 8, requires_grad=True)
    jfn = thunder_core.jit(head, executors=["inductor"], dynamic=True)
    for n in (4, 6, 10, 32):
        x = torch.randn(n, 16, requires_grad=True)
        out, expected = jfn(x, w), head(x, w)
        torch.testing.assert_close(out, expected)
        got = torch.autograd.grad(out.square().sum(), (x, w))
        want = torch.autograd.grad(expected.square().sum(), (x, w))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    assert thunder_core.cache_info(jfn).entries == 1
    regions = [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]
    assert regions and '"cpu f32[s0' in str(thunder_core.last_traces(jfn)[-1])
    (report,) = thunder_core.explain(jfn).for_symbol("torch.nn.functional.gelu")
    assert report.executor == "inductor"


def _window_sum(x, y):
    return (y * 2).softmax(-1)[:, : x.shape[0] // 2 + 1].sum()  # the end may run past the dimension


def test_regions_compiled_under_opposite_assumptions_about_sizes_are_not_mixed_up():
    """Calls whose slice end falls inside the dimension and calls where it runs past it (eager
    clamps it) compile with opposite size guards; Inductor's graph cache, which keeps no guards
    for a region's graph (its sizes come from its tensors), must not hand one the other's code."""
    y = torch.randn(3, 6)
    for lengths in ((2, 16, 4, 40), (16, 2)):  # a fresh function, first compiled past the end
        jfn = thunder_core.jit(_window_sum, executors=["inductor"], dynamic=True)
        for n in lengths:
            x = torch.randn(n, 4)
            torch.testing.assert_close(jfn(x, y), _window_sum(x, y))
        assert thunder_core.cache_info(jfn).entries == 2  # one program on each side
        (report,) = thunder_core.explain(jfn).for_symbol("torch.nn.functional.softmax")
        assert report.executor == "inductor"


def _diagonal_and_lower(x):
    return x.diagonal() * 2, x.tril()


@pytest.mark.parametrize("front_end", ["jit", "torch.compile"])
def test_a_region_compiled_under_an_assumption_inductor_made_is_not_reused_where_it_fails(front_end):
    """A diagonal's length is ``min(rows, columns)``: Inductor takes it as ``rows`` for the first,
    taller-than-wide sizes (a guard of the program), and the program compiled for wider sizes
    must not get that code back from Inductor's graph cache (the length came out ``rows``)."""
    if front_end == "jit":
        jfn = thunder_core.jit(_diagonal_and_lower, executors=["inductor"], dynamic=True)
    else:
        jfn = torch.compile(
            _diagonal_and_lower, backend="thunder_core", dynamic=True, options={"executors": ["inductor"]}
        )
    for rows in (4, 6, 8, 11, 3):
        x = torch.randn(rows, 6)
        for got, expected in zip(jfn(x), _diagonal_and_lower(x)):
            torch.testing.assert_close(got, expected)


def test_a_region_using_a_size_that_only_another_input_has_reads_it_from_that_input():
    """Hugging Face's decoding mask: ``arange(cache length + 1)`` compared with positions, where
    the region's own inputs do not have the cache's length. The region takes the cache as an
    extra input to read that size, and compiles once for every length instead of going back to
    torch op by op."""

    def mask(cache, positions, padding):
        kv = torch.arange(cache.shape[2] + 1)
        causal = kv[None, :] <= positions[:, None]
        return (causal & padding.bool()[:, : cache.shape[2] + 1]).float().cumsum(-1) * 2

    jfn = thunder_core.jit(mask, executors=["inductor"], dynamic=True)
    for length in (5, 9, 17):
        cache = torch.randn(1, 4, length, 8)
        positions = torch.tensor([length - 2])
        padding = torch.ones(1, 40, dtype=torch.int64)
        padding[0, 1] = 0
        torch.testing.assert_close(jfn(cache, positions, padding), mask(cache, positions, padding))
    assert thunder_core.cache_info(jfn).entries == 1
    trace = thunder_core.last_traces(jfn)[-1]
    (region,) = [b for b in trace.bound_symbols if b.executor == "inductor"]
    assert "cache" in [p.name for p in region.args], str(trace)
    assert not [b for b in trace.bound_symbols if b.executor == "torch" and b.symbol.name != "del"], str(
        trace
    )


@pytest.mark.parametrize("cpp_wrapper", [False, True])
def test_a_region_using_an_int_taken_symbolic_takes_the_int(cpp_wrapper):
    """``torch.arange(n)`` and ``x[:n]`` with ``n`` an int argument that changes between calls:
    the region takes ``n`` as an input (a SymInt of its graph) and compiles once for every value."""

    def scaled_head(x, n):
        ramp = torch.arange(n, dtype=torch.float32) * 2 + 1
        return (x[:n] * 2 + ramp[:, None]).sin(), torch.full((n, 2), 3.0).cos()

    options = {"inductor": {"regions": "maximal", "cpp_wrapper": cpp_wrapper}}
    jfn = thunder_core.jit(scaled_head, executors=["inductor"], options=options)
    x = torch.randn(16, 3)
    for n in (2, 3, 5, 9, 12, 4):
        torch.testing.assert_close(jfn(x, n), scaled_head(x, n))
    assert thunder_core.cache_info(jfn).entries == 2  # the first value, then every other one
    trace = thunder_core.last_traces(jfn)[-1]
    (region,) = [b for b in trace.bound_symbols if b.executor == "inductor"]
    assert [p.name for p in region.args] == ["x", "n"], str(trace)
    assert region.impl.failure is None  # compiled and ran, no fallback to torch


def _stored_in_a_cache(k):
    """What Hugging Face's ``DynamicLayer.update`` stores after a prefill: ``cat`` of an empty
    tensor and the new keys, which eager lays out contiguously whatever the keys' layout."""
    keys = torch.cat([torch.tensor([], dtype=k.dtype), k * 2], dim=-2)
    return keys, (k + 1).transpose(-1, -2)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_regions_results_have_eager_strides(dynamic):
    """Inductor's decompositions gave the cat the transposed input's layout; a program that
    stores the result and reads it back next call would see other strides than recorded."""
    jfn = thunder_core.jit(_stored_in_a_cache, executors=["inductor"], dynamic=dynamic)
    for n in (24, 30):
        k = torch.randn(1, n, 4, 32).transpose(1, 2)
        got, expected = jfn(k), _stored_in_a_cache(k)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
            assert a.stride() == b.stride()
    assert _regions(jfn)  # Inductor computed them


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_region_call_runs_the_generated_code_without_aot_runtime_wrappers(dynamic):
    x = torch.randn(64, 64)
    jfn = thunder_core.jit(lambda t: (F.silu(t) * t + 1).softmax(-1), executors=["inductor"], dynamic=dynamic)
    jfn(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = jfn(x)
    torch.testing.assert_close(out, (F.silu(x) * x + 1).softmax(-1))
    names = {e.name for e in prof.events()}
    computed_by_aten = names & {"aten::silu", "aten::mul", "aten::add", "aten::_softmax"}
    assert not computed_by_aten, names  # Inductor's kernel did the work
    assert not any("AOTDispatcher" in name or "CompiledFxGraph" in name for name in names), names


def test_a_traced_region_that_writes_in_place_is_functionalized_before_inductor():
    from thunder_executor_inductor._backend import _compile_static

    def region(x):
        y = x.clone()
        y.mul_(2)  # in place on a buffer the region made, as some decompositions do
        return (y + 1, y.sum(-1))

    x = torch.randn(8, 16)
    run = _compile_static(region, [torch.empty_like(x)], {})
    for got, expected in zip(run(x), region(x)):
        torch.testing.assert_close(got, expected)


def _regions(jfn):
    return [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]


def _background_regions(jfn):
    """The regions' background compiles (``state``, ``compiled``, ``failure``): what the
    generated code calls (``fn`` of its first-call wrapper), or what a measured claim waits for."""
    found = []
    for region in _regions(jfn):
        impl = getattr(region.impl, "waits_for", None) or getattr(region.impl, "fn", None)
        if hasattr(impl, "done") and hasattr(impl, "compiled"):
            found.append(impl)
    return found


def gated_mlp(x, w):
    return (F.silu(x) * x + 1).softmax(-1) @ w


def test_a_recompiled_program_runs_at_once_and_inductor_takes_over_when_its_compile_is_done():
    jfn = thunder_core.jit(
        gated_mlp, executors=["inductor"], dynamic=False, compile_in_background="recompiles"
    )
    w = torch.randn(32, 16)
    first = torch.randn(8, 32)
    torch.testing.assert_close(jfn(first, w), gated_mlp(first, w))
    assert _background_regions(jfn) == []  # the first program was compiled before it ran
    second = torch.randn(12, 32)
    torch.testing.assert_close(jfn(second, w), gated_mlp(second, w))
    (region,) = _background_regions(jfn)
    assert thunder_core.wait_for_compiles(timeout=300)
    torch.testing.assert_close(jfn(second, w), gated_mlp(second, w))
    assert region.failure is None and "def call" in region.compiled.source_code  # Inductor's generated code
    notes = [r.note for r in thunder_core.explain(jfn).operations if r.executor == "inductor"]
    assert notes and all("compiled in the background" in n for n in notes)


def test_a_symbolic_recompile_compiles_in_the_background_and_serves_every_size():
    jfn = thunder_core.jit(gated_mlp, executors=["inductor"], compile_in_background="recompiles")
    w = torch.randn(32, 16)
    for n in (8, 12):
        x = torch.randn(n, 32)
        torch.testing.assert_close(jfn(x, w), gated_mlp(x, w))
    assert thunder_core.wait_for_compiles(timeout=300)
    (region,) = _background_regions(jfn)
    for n in (5, 30, 12):
        x = torch.randn(n, 32)
        torch.testing.assert_close(jfn(x, w), gated_mlp(x, w))
    assert region.failure is None and region.compiled is not None  # no size assumption left unguarded
    assert thunder_core.cache_info(jfn).entries == 2


def test_compile_in_background_never_and_always():
    w, x, y = torch.randn(32, 16), torch.randn(8, 32), torch.randn(12, 32)
    never = thunder_core.jit(gated_mlp, executors=["inductor"], dynamic=False)  # the default: "never"
    never(x, w)
    torch.testing.assert_close(never(y, w), gated_mlp(y, w))
    # a recompile with fixed sizes: its regions compile before its second call, not on the worker
    left = _background_regions(never)
    assert left and all(r.compiled is None for r in left) and _regions(never)
    (report,) = thunder_core.explain(never).for_symbol("torch.nn.functional.silu")
    assert "compiled before its program's second call" in report.note, report.note
    torch.testing.assert_close(never(y, w), gated_mlp(y, w))
    assert all(r.compiled is not None for r in left)
    assert thunder_core.wait_for_compiles(timeout=0)  # nothing went to the worker
    always = thunder_core.jit(gated_mlp, executors=["inductor"], compile_in_background="always")
    torch.testing.assert_close(always(x, w), gated_mlp(x, w))
    assert len(_background_regions(always)) == 1


def test_a_compile_of_another_function_waits_for_the_one_in_the_background():
    """Inductor compiles one graph at a time: a first program compiled while a recompile's
    regions compile in the background takes its turn, and both give eager's results."""
    jfn = thunder_core.jit(
        gated_mlp, executors=["inductor"], dynamic=False, compile_in_background="recompiles"
    )
    w = torch.randn(32, 16)
    jfn(torch.randn(8, 32), w)
    y = torch.randn(12, 32)
    jfn(y, w)  # hands its regions to the worker

    def other(x):
        return (x.exp() + x).tanh().sum(-1)

    jother = thunder_core.jit(other, executors=["inductor"])
    x = torch.randn(6, 7)
    torch.testing.assert_close(jother(x), other(x))
    assert thunder_core.wait_for_compiles(timeout=300)
    torch.testing.assert_close(jfn(y, w), gated_mlp(y, w))
    assert all(r.compiled is not None for r in _background_regions(jfn))


def test_the_front_end_takes_compile_in_background_from_the_environment(monkeypatch):
    """Every graph Dynamo hands over runs at once, its Inductor regions compiled on the worker."""
    import torch._dynamo

    monkeypatch.setenv("THUNDER_CORE_COMPILE_IN_BACKGROUND", "always")
    torch._dynamo.reset()
    compiled = torch.compile(gated_mlp, backend="thunder_core", dynamic=False,
                             options={"executors": ["inductor"]})  # fmt: skip
    w = torch.randn(32, 16)
    for n in (8, 12):
        x = torch.randn(n, 32)
        torch.testing.assert_close(compiled(x, w), gated_mlp(x, w))
    assert thunder_core.wait_for_compiles(timeout=300)
    for n in (8, 12):
        x = torch.randn(n, 32)
        torch.testing.assert_close(compiled(x, w), gated_mlp(x, w))
    notes = [r.note for r in thunder_core.explain(compiled).operations if r.executor == "inductor"]
    assert notes and all("compiled in the background" in n for n in notes), notes
    torch._dynamo.reset()


_LAZY_IMPORT = """
import json, sys
import torch
import thunder_core

x = torch.randn(8, 16)
add = thunder_core.jit(lambda a, b: a + b)  # the default executors, Inductor among them
same = torch.equal(add(x, x), x + x)
before = [m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules]
chain = thunder_core.jit(lambda a: (a.sin() * 2).softmax(-1), executors=["inductor"])
same = same and torch.allclose(chain(x), (x.sin() * 2).softmax(-1))
ran = [b.executor for b in thunder_core.last_traces(chain)[-1].bound_symbols if b.executor == "inductor"]
print(json.dumps({"same": same, "before": before, "after": "torch._inductor" in sys.modules, "ran": ran}))
"""


def test_inductor_is_imported_when_its_first_region_compiles_not_when_the_plugin_is_found():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LAZY_IMPORT], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "before": [], "after": True, "ran": ["inductor"]}


_MODEL_STARTS_THE_CHECK = """
import json, sys
import torch
import thunder_core

x = torch.randn(8, 16)
add = thunder_core.jit(lambda a, b: a + b, executors=["inductor", "torch"])
add(x, x)
after_function = "thunder_executor_inductor._vec_isa" in sys.modules
model = torch.nn.Linear(16, 4)
jmodel = thunder_core.jit(model, executors=["inductor", "torch"])  # the linear alone is no Inductor region
same = torch.allclose(jmodel(x), model(x))
from thunder_executor_inductor import _vec_isa
print(json.dumps({"after_function": after_function, "started": _vec_isa._thread is not None, "same": same}))
"""


def test_a_models_first_compile_starts_the_cpu_check_while_it_is_captured():
    """The vector ISA check (seconds on a first compile with empty caches) starts before a model
    is captured; a plain function's compile does not start it (nor import Inductor)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _MODEL_STARTS_THE_CHECK], capture_output=True, text=True, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"after_function": False, "started": True, "same": True}


_PROBE_TWICE = """
import json, sys
from torch._inductor import cpu_vec_isa
from thunder_executor_inductor import _backend

real = cpu_vec_isa.VecISA._probe_load
children = []

def counting(self, path):
    children.append(str(self))
    return real(self, path)

cpu_vec_isa.VecISA._probe_load = counting
from thunder_executor_inductor import _vec_isa
_vec_isa.start({})
_vec_isa.wait()
print(json.dumps({"children": children, "valid": [str(i) for i in cpu_vec_isa.valid_vec_isa_list()]}))
"""


def test_a_vector_isa_library_that_loaded_is_not_probed_again_in_the_next_process(tmp_path):
    """Inductor checks in a child Python per ISA that its test library loads, in every process;
    a load that succeeded on this machine is remembered beside Inductor's cache."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _PROBE_TWICE],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            ).stdout.splitlines()[-1]
        )
        for _ in range(2)
    ]
    if not runs[0]["valid"]:
        pytest.skip("no vector ISA loads on this CPU: nothing to remember")
    assert runs[0]["children"], runs  # the first process probed
    failed = set(runs[0]["children"]) - set(runs[0]["valid"])  # probed again: only successes are kept
    assert set(runs[1]["children"]) == failed, runs  # the second remembered every load that succeeded
    assert runs[1]["valid"] == runs[0]["valid"]  # and Inductor chose the same ISAs


_BUILT_LATER = """
import json, os, warnings
import torch
import thunder_core
from thunder_executor_inductor import _backend

pending = []  # kernels still building when each region's first call came
finish = _backend._finish


def counting(modules):
    pending.append(sum(isinstance(v, _backend._KERNEL_FUTURES) for scope in modules for v in scope.values()))
    finish(modules)


_backend._finish = counting
f = lambda a: (a.sin() * 2).softmax(-1)
x = torch.randn(8, 16)
background = os.environ.get("BACKGROUND", "never")
jf = thunder_core.jit(f, executors=["inductor"], compile_in_background=background)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    results = [jf(x)]
    thunder_core.wait_for_compiles()  # with "always": the worker compiled the region meanwhile
    results += [jf(x), jf(x)]
regions = [b for b in thunder_core.last_traces(jf)[-1].bound_symbols if b.executor == "inductor"]
print(json.dumps({
    "same": all(torch.allclose(r, f(x)) for r in results),
    "pending": pending,
    "failures": [getattr(b.impl, "failure", None) for b in regions],
    "warnings": [str(w.message)[:200] for w in caught if "thunder_core" in str(w.message)],
}))
"""


def _run_built_later(tmp_path, **env) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TORCHINDUCTOR_COMPILE_THREADS": "2",  # with one, Inductor builds each kernel as it asks for it
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", _BUILT_LATER], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_regions_kernels_build_while_the_program_compiles_and_are_bound_at_its_first_call(tmp_path):
    """The compiler processes of one region run while the next regions compile: the region's
    compile returns with its kernels still building, its first call waits for them."""
    result = _run_built_later(tmp_path)
    assert result["same"] and result["failures"] == [None] and not result["warnings"], result
    assert result["pending"] and result["pending"][0] >= 1, result  # a kernel was still a future then
    assert len(result["pending"]) == 1, result  # bound once, not on every call


def test_a_region_compiled_on_the_worker_is_built_before_it_is_swapped_in(tmp_path):
    """The worker's compile finishes the kernel builds: the caller's thread never waits for them."""
    result = _run_built_later(tmp_path, BACKGROUND="always")
    assert result["same"] and result["failures"] == [None] and not result["warnings"], result
    assert result["pending"] == [], result  # nothing was left building for a first call to wait for


def test_a_kernel_that_fails_to_build_falls_back_to_torch_at_the_regions_first_call(tmp_path):
    """A kernel build that fails after the compile returned is a failed first run: torch runs
    the region, with a warning naming the executor and the compiler's error."""
    import shutil

    real = shutil.which("g++")
    if real is None:
        pytest.skip("no g++ on this machine: Inductor compiles no C++ kernel here")
    wrapper = tmp_path / "bin" / "g++"  # answers everything as g++, but refuses to build kernels
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" -E "*|*" --version "*|*" -dumpversion "*) exec {real} "$@" ;; esac\n'
        'case "$*" in *.main.cpp*) echo "kernel build refused" >&2; exit 1 ;; esac\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    result = _run_built_later(tmp_path, CXX=str(wrapper))
    assert result["same"], result  # eager's results, from torch
    assert result["failures"][0] and "kernel build refused" in result["failures"][0], result
    assert any("'inductor' failed on its first run" in w for w in result["warnings"]), result


_PROBE_ONCE = """
import json
from torch._inductor import cpu_vec_isa
from thunder_executor_inductor import _vec_isa

_vec_isa.start({})
_vec_isa.wait()
flags = cpu_vec_isa.x86_isa_checker()
candidates = [str(i) for i in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(i).split())]
print(json.dumps({"valid": [str(i) for i in cpu_vec_isa.valid_vec_isa_list()],
                  "picked": str(cpu_vec_isa.pick_vec_isa()), "candidates": candidates}))
"""


def test_the_widest_vector_isa_is_probed_alone_unless_another_may_be_asked_for(tmp_path):
    """Inductor uses the widest ISA that works: when it does, the narrower ones are not built;
    with ATEN_CPU_CAPABILITY set, every candidate is probed and the one asked for is picked."""
    import json
    import os
    import subprocess
    import sys

    def probe(**env):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE_ONCE],
            env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / str(len(env))), **env},
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return json.loads(done.stdout.splitlines()[-1])

    plain = probe()
    if len(plain["candidates"]) < 2 or "avx2" not in plain["candidates"]:
        pytest.skip("this CPU names fewer than two x86 vector ISAs: nothing to leave out")
    assert plain["valid"] == [plain["candidates"][0]] == [plain["picked"]], plain
    asked = probe(ATEN_CPU_CAPABILITY="avx2")
    assert asked["picked"] == "avx2" and len(asked["valid"]) > 1, asked


def test_a_linear_whose_weight_transpose_went_back_to_torch_runs_whole():
    """Inductor takes the transpose of ``linear``'s decomposition but not its matmul; the
    transpose alone is no region, so both parts end with torch, which then runs the ``linear``
    itself (one library call, as eager), not a permute and a matmul."""

    def f(x, w):
        return F.linear(x, w).sin().cos()

    x, w = torch.randn(2, 64), torch.randn(32, 64)
    jfn = thunder_core.jit(f, executors=["inductor"])
    torch.testing.assert_close(jfn(x, w), f(x, w))
    trace = thunder_core.last_traces(jfn)[-1]
    names = [(b.symbol.name, b.executor) for b in trace.bound_symbols if b.symbol.name != "del"]
    assert ("linear", "torch") in names and not any(n in ("matmul", "permute") for n, _ in names), names
    (report,) = thunder_core.explain(jfn).for_symbol("torch.nn.functional.linear")
    assert report.executor == "torch"
