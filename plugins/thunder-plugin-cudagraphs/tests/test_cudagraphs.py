"""reduce-overhead: the partitioning on CPU traces; capture and replay on a GPU."""

from __future__ import annotations

import pytest
import torch
from thunder_plugin_cudagraphs import graphs

import thunder_core


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Tanh()
    )


def mlp(x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
    return torch.tanh(torch.nn.functional.linear(h, w2, b2))


def _lowered(fn, *args):
    """The claimed trace, as the ``after_executors`` stage sees it (before ``del`` statements)."""
    jitted = thunder_core.jit(fn, executors=["torch"])
    jitted(*args)
    return [t for t in thunder_core.last_traces(jitted) if "delete_last_used" not in str(t.provenance)][-1]


def test_graph_safe_runs_become_graph_calls_and_compute_the_same():
    args = [torch.randn(4, 16), torch.randn(32, 16), torch.randn(32), torch.randn(8, 32), torch.randn(8)]
    trace = _lowered(mlp, *args)
    partitioned = graphs.partition(trace, {"device": "any", "min_ops": 2})
    names = [b.symbol.name for b in partitioned.bound_symbols]
    assert names.count("cudagraph_1") == 1 and "linear" not in names  # the whole MLP is one run
    code = str(partitioned)
    assert "cudagraph_1(" in code and "# t" in code  # the call, with the operations it holds as comments
    runner = graphs.runners(partitioned)[0]
    torch.testing.assert_close(partitioned.python_callable()(*args), mlp(*args))
    assert runner.captures == 0  # CPU tensors: the runner calls the operations without a graph
    assert (
        graphs.partition(trace, {"device": "cuda", "min_ops": 2}) is trace
    )  # CPU tensors: no graph-safe run


def test_in_place_updates_end_a_graph():
    def f(x, buffer):
        y = torch.sin(x) * 2
        buffer.add_(y)  # in place: stays outside the graphs
        z = torch.cos(y) + 1
        return torch.exp(z) * 3

    x, buffer = torch.randn(8), torch.zeros(8)
    trace = _lowered(f, x, buffer.clone())
    partitioned = graphs.partition(trace, {"device": "any", "min_ops": 2})
    calls = [b for b in partitioned.bound_symbols if b.symbol.name.startswith("cudagraph_")]
    assert len(calls) == 2  # before and after the in-place update
    assert all(not b.symbol.has_tag("inplace") for call in calls for b in call.subsymbols)
    expected_buffer = buffer.clone()
    expected = f(x, expected_buffer)
    got_buffer = buffer.clone()
    torch.testing.assert_close(partitioned.python_callable()(x, got_buffer), expected)
    torch.testing.assert_close(got_buffer, expected_buffer)


def test_a_fusion_region_that_writes_its_input_stays_outside_the_graphs():
    """A maximal Inductor region holds a cache write: in a graph it would write the graph's static
    copy of the cache, so it is not graph-safe."""
    pytest.importorskip("thunder_executor_inductor")

    def step(cache, x, position):
        cache.index_copy_(0, position, torch.sin(x) * 2)
        return (cache * 3).cos() + 1

    cache, x, position = torch.zeros(4, 8), torch.randn(1, 8), torch.tensor([2])
    jitted = thunder_core.jit(step, executors=["inductor"], options={"inductor": {"regions": "maximal"}})
    with torch.no_grad():
        jitted(cache.clone(), x, position)
    trace = [t for t in thunder_core.last_traces(jitted) if "delete_last_used" not in str(t.provenance)][-1]
    (writer,) = [
        b
        for b in trace.bound_symbols
        if b.executor == "inductor" and any(s.symbol.name.endswith("index_copy_") for s in b.subsymbols)
    ]
    partitioned = graphs.partition(trace, {"device": "any", "min_ops": 1})
    inside = [
        s for b in partitioned.bound_symbols if b.symbol.name.startswith("cudagraph_") for s in b.subsymbols
    ]
    assert writer.symbol.name not in [s.symbol.name for s in inside]
    assert writer.symbol.name in [b.symbol.name for b in partitioned.bound_symbols]


def test_on_cpu_the_plugin_is_unavailable_with_the_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(thunder_core.PluginError, match="reduce-overhead.*(CPU-only build|no CUDA device)"):
        thunder_core.jit(_mlp(), plugins=["reduce-overhead"])


def _probe_reason() -> str | None:
    from thunder_plugin_cudagraphs import thunder_core_probe

    found = thunder_core_probe()
    return None if found.available else found.reason


@pytest.mark.skipif(_probe_reason() is not None, reason=f"reduce-overhead is unavailable: {_probe_reason()}")
def test_gpu_graph_is_captured_once_and_replayed():
    model = _mlp().cuda()
    jitted = thunder_core.jit(model, plugins=["reduce-overhead"])
    xs = [torch.randn(4, 16, device="cuda") for _ in range(4)]
    with torch.no_grad():
        for x in xs:
            torch.testing.assert_close(jitted(x), model(x))
    runners = graphs.runners(thunder_core.last_traces(jitted)[-1])
    assert runners and all(r.captures == 1 and r.replays == len(xs) for r in runners)

    model.train()
    x = torch.randn(4, 16, device="cuda", requires_grad=True)
    jitted(x).sum().backward()
    expected = torch.autograd.grad(model(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)
    backward = graphs.runners(thunder_core.last_backward_traces(jitted)[-1])
    assert backward and all(r.replays >= 1 for r in backward)
