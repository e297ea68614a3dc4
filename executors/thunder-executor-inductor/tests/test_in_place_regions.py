"""Regions that overwrite their inputs in place (a cache write) against eager PyTorch.

Each test checks the results and the written tensors against eager on a copy of the inputs,
and that the write ran inside Inductor's compiled region (or, where the region must not run
compiled, that its torch operations ran instead).
"""

from __future__ import annotations

import pytest
import torch

import thunder_core

MAXIMAL = {"inductor": {"regions": "maximal"}}


def _regions(jfn):
    return [b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"]


def _region_writing(jfn, method: str):
    """The Inductor region whose operations include ``method`` (an in-place update)."""
    found = [r for r in _regions(jfn) if any(s.symbol.name.endswith(method) for s in r.subsymbols)]
    assert len(found) == 1, [[s.symbol.name for s in r.subsymbols] for r in _regions(jfn)]
    return found[0]


def _is_checked(fn) -> bool:
    return type(fn).__name__ == "SeparateInputs"  # thunder_core.executors.in_place (core internals)


def _separate_inputs(region):
    """The compiled region, checked for overlapping inputs on each call (its ``_fallback`` is the
    region's torch operations, made when a call needed them)."""
    guarded = region.impl.fn  # FirstCall -> the compiled region, or its compile at the second call
    if not _is_checked(guarded):
        guarded = guarded.compiled
    assert _is_checked(guarded), guarded
    return guarded


def cache_step(keys, x, w, position):
    new = torch.sin(x @ w) * 2  # (1, 1, d): one new row
    keys.index_copy_(1, position, new)
    return (keys * 3).softmax(-1).sum(1)


def _cache_inputs(length=6, d=8):
    return torch.zeros(1, length, d), torch.randn(1, 1, d), torch.randn(d, d)


def test_a_cache_write_runs_inside_the_compiled_region_and_the_cache_holds_eagers_values():
    keys, x, w = _cache_inputs()
    eager_keys = keys.clone()
    jfn = thunder_core.jit(cache_step, executors=["inductor"], options=MAXIMAL)
    with torch.no_grad():
        for step in range(4):
            position = torch.tensor([step])
            x = torch.randn(1, 1, 8)
            torch.testing.assert_close(jfn(keys, x, w, position), cache_step(eager_keys, x, w, position))
            torch.testing.assert_close(keys, eager_keys)
    region = _region_writing(jfn, "index_copy_")
    guarded = _separate_inputs(region)
    assert guarded._fallback is None  # every call ran the compiled region
    assert region.impl.failure is None
    assert "keys" not in [p.name for p in region.output]  # the cache is the caller's tensor, written


def _write_all(keys, window, x, position):
    keys.copy_(torch.cos(x) + 1)  # compiled as a copy into the input after the graph's reads
    return window.exp() * 2  # in eager, reads what was just written when it views the cache


def _write_row(keys, window, x, position):
    keys.index_copy_(1, position, torch.cos(x[:, :1]) + 1)
    return window.exp() * 2


def _write_detached(keys, window, x, position):
    keys.detach().copy_(torch.cos(x) + 1)  # detach returns the cache's memory: the write reaches it
    return window.exp() * 2


@pytest.mark.parametrize(
    "step", [_write_all, _write_row, _write_detached], ids=["copy_", "index_copy_", "detach"]
)
def test_a_write_to_an_input_that_shares_memory_with_another_input_runs_the_torch_operations(step):
    jfn = thunder_core.jit(step, executors=["inductor"], options=MAXIMAL)
    keys, x, position = torch.zeros(1, 4, 8), torch.randn(1, 4, 8), torch.tensor([1])
    with torch.no_grad():
        separate, eager_keys = torch.zeros(1, 2, 8), keys.clone()
        torch.testing.assert_close(jfn(keys, separate, x, position), step(eager_keys, separate, x, position))
        assert _separate_inputs(_region_writing(jfn, "copy_"))._fallback is None
        for _ in range(2):  # a recompile for the view's strides compiles its region at its second call
            eager_keys = keys.clone()
            got = jfn(keys, keys[:, :2], x, position)  # a view of the cache beside the cache
            expected = step(eager_keys, eager_keys[:, :2], x, position)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(keys, eager_keys)
    guarded = _separate_inputs(_region_writing(jfn, "copy_"))  # the entry for the view's strides
    assert guarded._fallback is not None  # that call ran the region's torch operations


@pytest.mark.parametrize("background", ["never", "always"])
def test_a_region_that_reads_what_it_writes_before_the_write_gives_eagers_results(background):
    def step(buffer, x, position):
        before = buffer.sum(1)  # read before the write: running the region twice would differ
        buffer.index_copy_(1, position, x.tanh())
        return before + buffer.mean(1)

    jfn = thunder_core.jit(step, executors=["inductor"], options=MAXIMAL, compile_in_background=background)
    buffer = torch.randn(1, 5, 4)
    eager_buffer = buffer.clone()
    with torch.no_grad():
        for step_index in range(3):
            x, position = torch.randn(1, 1, 4), torch.tensor([step_index])
            torch.testing.assert_close(jfn(buffer, x, position), step(eager_buffer, x, position))
            torch.testing.assert_close(buffer, eager_buffer)
            thunder_core.wait_for_compiles()
    assert _region_writing(jfn, "index_copy_").impl.failure is None


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed sizes", "symbolic sizes"])
def test_item_assignment_copy_fill_and_masked_fill_inside_regions_equal_eager(dynamic):
    def update(a, b, c, d, x):
        y = torch.sigmoid(x) * 3
        a[:, 1] = y[:, 0]  # item assignment through a view
        b.copy_(y.t() - 1)
        c.masked_fill_(y > 1.5, -2.0)
        d.fill_(0.25)
        return a.sum() + b.exp().sum() + (c * d).sum()

    jfn = thunder_core.jit(update, executors=["inductor"], options=MAXIMAL, dynamic=dynamic)
    for n in (4, 4, 6) if dynamic else (4, 4):
        x = torch.randn(n, n)
        tensors = [torch.randn(n, n) for _ in range(4)]
        eager = [t.clone() for t in tensors]
        with torch.no_grad():
            torch.testing.assert_close(jfn(*tensors, x), update(*eager, x))
        for t, e in zip(tensors, eager):
            torch.testing.assert_close(t, e)
    (region,) = _regions(jfn)
    names = {s.symbol.name.rsplit(".", 1)[-1] for s in region.subsymbols}
    assert {"__setitem__", "copy_", "masked_fill_", "fill_"} <= names, names
    assert _separate_inputs(region)._fallback is None


def test_a_cache_write_with_symbolic_sizes_compiles_once_for_every_cache_length():
    jfn = thunder_core.jit(cache_step, executors=["inductor"], options=MAXIMAL, dynamic=True)
    with torch.no_grad():
        for length in (6, 9, 13):
            keys, x, w = _cache_inputs(length)
            eager_keys = keys.clone()
            position = torch.tensor([length - 2])
            torch.testing.assert_close(jfn(keys, x, w, position), cache_step(eager_keys, x, w, position))
            torch.testing.assert_close(keys, eager_keys)
    assert thunder_core.cache_info(jfn).misses == 1
    assert _separate_inputs(_region_writing(jfn, "index_copy_"))._fallback is None


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed sizes", "symbolic sizes"])
def test_a_cache_write_is_compiled_without_aotautograds_runtime_wrappers(monkeypatch, dynamic):
    """The write is functionalized by the executor itself and the generated code called directly
    (as for regions that write nothing): ``standalone_compile``, whose AOTAutograd wrappers cost
    every call, is not used."""
    standalone = []
    real = torch._inductor.standalone_compile
    monkeypatch.setattr(
        torch._inductor, "standalone_compile", lambda *a, **k: standalone.append(a) or real(*a, **k)
    )
    jfn = thunder_core.jit(cache_step, executors=["inductor"], options=MAXIMAL, dynamic=dynamic)
    with torch.no_grad():
        for length in (6, 9):
            keys, x, w = _cache_inputs(length)
            eager_keys = keys.clone()
            for step in range(3):
                position = torch.tensor([step])
                torch.testing.assert_close(jfn(keys, x, w, position), cache_step(eager_keys, x, w, position))
                torch.testing.assert_close(keys, eager_keys)
    assert _separate_inputs(_region_writing(jfn, "index_copy_"))._fallback is None
    assert not standalone


def _write_and_return_it(keys, x, position):
    keys.index_copy_(1, position, torch.sin(x) * 2)
    return keys.detach(), keys.sum()  # the first result is the cache's memory


def _overwrite_and_return_it(keys, x, position):
    keys.copy_(torch.cos(x) + position)
    return keys.detach(), keys.sum()


@pytest.mark.parametrize(
    ("write", "method"),
    [(_write_and_return_it, "index_copy_"), (_overwrite_and_return_it, "copy_")],
    ids=["index_copy_", "copy_"],
)
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed sizes", "symbolic sizes"])
def test_a_region_returning_the_memory_it_writes_returns_the_callers_tensor(dynamic, write, method):
    """A result that shares memory with a written input stays the caller's memory (eager's
    ``keys.detach()``), so a later change to the cache shows in it, as in eager."""
    keys, eager_keys = torch.zeros(1, 6, 8), torch.zeros(1, 6, 8)
    jfn = thunder_core.jit(write, executors=["inductor"], options=MAXIMAL, dynamic=dynamic)
    with torch.no_grad():
        for step in range(3):
            x, position = torch.randn(1, 1, 8), torch.tensor([step])
            got, expected = jfn(keys, x, position), write(eager_keys, x, position)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(keys, eager_keys)
            keys.add_(1)
            eager_keys.add_(1)
            torch.testing.assert_close(got, expected)  # the returned tensor is the cache
    assert _region_writing(jfn, method).impl.failure is None


def test_a_cache_write_compiles_in_the_background_and_the_compiled_region_takes_over():
    jfn = thunder_core.jit(
        cache_step, executors=["inductor"], options=MAXIMAL, compile_in_background="always"
    )
    keys, x, w = _cache_inputs()
    eager_keys = keys.clone()
    with torch.no_grad():
        for step in range(5):
            position = torch.tensor([step])
            torch.testing.assert_close(jfn(keys, x, w, position), cache_step(eager_keys, x, w, position))
            torch.testing.assert_close(keys, eager_keys)
            thunder_core.wait_for_compiles()
    background = _region_writing(jfn, "index_copy_").impl.fn
    assert background.state == "compiled", background.state
    assert _is_checked(background.compiled)  # the last calls wrote with the compiled region
    assert background.compiled._fallback is None


def test_fusion_regions_leave_a_cache_write_to_torch():
    """Regions cut at every matmul would each add a call and its checks for a write: only maximal
    regions take it."""
    keys, x, w = _cache_inputs()
    eager_keys = keys.clone()
    jfn = thunder_core.jit(cache_step, executors=["inductor"])
    with torch.no_grad():
        torch.testing.assert_close(
            jfn(keys, x, w, torch.tensor([2])), cache_step(eager_keys, x, w, torch.tensor([2]))
        )
    torch.testing.assert_close(keys, eager_keys)
    (write,) = [
        b for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.symbol.name.endswith("index_copy_")
    ]
    assert write.executor == "torch"
    assert _regions(jfn)  # the rest still fuses


def test_a_write_to_a_tensor_that_requires_grad_stays_with_torch():
    def step(buffer, x):
        buffer.copy_(x.sin())
        return buffer * 2

    jfn = thunder_core.jit(step, executors=["inductor"], options=MAXIMAL)
    x = torch.randn(3, requires_grad=True)
    buffer, eager_buffer = torch.zeros(3), torch.zeros(3)
    out = jfn(buffer, x)
    expected = step(eager_buffer, x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    expected.sum().backward()
    torch.testing.assert_close(grad, x.grad)
    torch.testing.assert_close(buffer, eager_buffer)
    traces = thunder_core.last_traces(jfn)
    for trace in traces if isinstance(traces, list) else [traces]:
        for b in getattr(trace, "bound_symbols", ()):
            assert not (
                b.executor == "inductor" and any(s.symbol.name.endswith("copy_") for s in b.subsymbols)
            )


def _first_run_fails_after_writing(monkeypatch):
    """Inductor's compiled regions raise on their first call, after they have run (and written)."""
    from thunder_executor_inductor import _impl

    compile_region = _impl.InductorExecutor.compile_region

    def failing_once(self, region):
        compiled = compile_region(self, region)
        calls = []

        def run(*args):
            result = compiled(*args)
            if not calls:
                calls.append(True)
                raise RuntimeError("the compiled region failed after its write")
            return result

        return run

    monkeypatch.setattr(_impl.InductorExecutor, "compile_region", failing_once)


def test_a_restartable_region_that_fails_after_its_write_falls_back_and_writes_eagers_values(monkeypatch):
    _first_run_fails_after_writing(monkeypatch)
    keys, x, w = _cache_inputs()
    eager_keys = keys.clone()
    jfn = thunder_core.jit(cache_step, executors=["inductor"], options=MAXIMAL)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="failed after its write"):
        got = jfn(keys, x, w, torch.tensor([3]))
    torch.testing.assert_close(got, cache_step(eager_keys, x, w, torch.tensor([3])))
    torch.testing.assert_close(keys, eager_keys)  # written again by torch, with the same values


def test_a_region_that_reads_before_its_write_refuses_to_run_again_after_a_failure(monkeypatch):
    def step(buffer, x, position):
        before = buffer.sum(1)
        buffer.index_copy_(1, position, x.tanh())
        return before + buffer.mean(1)

    _first_run_fails_after_writing(monkeypatch)
    jfn = thunder_core.jit(step, executors=["inductor"], options=MAXIMAL)
    with torch.no_grad(), pytest.raises(thunder_core.ThunderCoreError, match="apply it twice") as raised:
        jfn(torch.randn(1, 5, 4), torch.randn(1, 1, 4), torch.tensor([0]))
    assert type(raised.value).__name__ == "ExecutorFailure"
