"""Seeing what the compiler did: profiler ranges, ``examine``, reproducers and the HTML report."""

from __future__ import annotations

import copy

import pytest
import torch
from models import litgpt_gpt, token_batch
from torch.profiler import profile

import thunder_core
from thunder_core.ir.codegen import region_name


def _executor_calls(traces) -> set[str]:
    """The range name of every executor call of the executed traces (the last forward/backward)."""
    names = set()
    for trace in traces:
        if trace.decisions:  # an executed trace: every bound symbol has its executor
            names |= {
                region_name(trace, b) for b in trace.bound_symbols if b.executor not in (None, "python")
            }
    return names


def _training_step(model, idx):
    logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    return loss


def test_every_executor_call_is_a_named_range_under_torch_profiler():
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2)
    reference = copy.deepcopy(model)
    jitted = thunder_core.jit(model)
    idx = token_batch(2, 17)
    _training_step(jitted, idx)  # compiled outside the profiler
    with profile() as prof:
        loss = _training_step(jitted, idx)
    torch.testing.assert_close(loss, _training_step(reference, idx))
    recorded = {e.name for e in prof.events()}
    traces = [*thunder_core.last_traces(jitted)]
    for block in thunder_core.last_blocks(jitted):
        traces += [*block.traces, *block.backward_traces]
    expected = _executor_calls(traces)
    assert expected and expected <= recorded, sorted(expected - recorded)[:10]
    assert {"thunder_core/forward", "thunder_core/backward"} <= recorded
    executors = {name.rsplit("[", 1)[1].rstrip("]") for name in expected}
    assert "torch" in executors
    if "inductor" in thunder_core.explain(jitted).executors:  # a fused region's own range
        assert any(name.endswith("[inductor]") and "fusion" in name for name in recorded)


def test_without_a_profiler_the_plain_program_runs():
    from thunder_core.ir.codegen import _ProfiledVersion

    def f(x):
        return torch.tanh(x) * 2 + 1

    jitted = thunder_core.jit(f)
    x = torch.randn(8)
    for _ in range(2):
        torch.testing.assert_close(jitted(x), f(x))
    executed = thunder_core.last_traces(jitted)[-1]
    (profiled,) = [
        v for v in executed.python_callable().__globals__.values() if isinstance(v, _ProfiledVersion)
    ]
    assert profiled.run is None  # never built: no range was entered
    with profile() as prof:
        torch.testing.assert_close(jitted(x), f(x))
    assert profiled.run is not None
    assert f"thunder_core/{executed.function_name}" in {e.name for e in prof.events()}
