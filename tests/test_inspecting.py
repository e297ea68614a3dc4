"""Seeing what the compiler did: profiler ranges, ``examine``, reproducers and the HTML report."""

from __future__ import annotations

import copy

import pytest
import torch
from models import hf_zoo, litgpt_gpt, token_batch
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


def _registered(name: str) -> bool:
    from thunder_core.ops.prims import PRIMS
    from thunder_core.ops.registry import TORCH_SYMBOLS

    return any(s.printed_name == name for s in (*TORCH_SYMBOLS.values(), *PRIMS.values()))


@pytest.mark.parametrize("name", sorted(hf_zoo()))
def test_examine_lists_what_runs_natively_and_opaquely_and_agrees_with_eager(name):
    torch.manual_seed(0)
    model = hf_zoo()[name]()
    idx = token_batch(2, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kwargs = {"decoder_input_ids": idx} if name == "t5" else {}
    found = thunder_core.examine(model, idx, **kwargs)
    assert not found.error
    assert found.matches_eager, found.mismatch
    assert found.gradients_compared > 0  # training: every parameter's gradient was compared too
    assert sum(found.native.values()) > 0
    for op in found.native:  # thunder-core's own symbols ...
        assert _registered(op), op
    for op in found.opaque:  # ... and torch calls it has no symbol for
        assert not _registered(op), op
    assert found.executors and set(found.executors) <= {*found.explanation.executors, "(decomposed)"}
    text = str(found)
    assert "matches eager" in text and all(op in text for op in found.opaque)
    for k, v in model.state_dict().items():  # the caller's model is untouched (no gradients either)
        torch.testing.assert_close(v, before[k])
    assert all(p.grad is None for p in model.parameters())


def test_examine_counts_an_opaque_operation_and_a_repeated_block_per_call():
    def program(x):
        y = x * 2
        y.add_(1)  # in-place methods on intermediates: opaque torch calls
        y.add_(x)
        return y.sin()

    found = thunder_core.examine(program, torch.rand(8))
    assert found.opaque["torch.Tensor.add_"] == 2
    assert found.native["torch.sin"] == 1 and found.native["torch.mul"] == 1
    assert found.matches_eager

    model = litgpt_gpt(n_layer=3)
    idx = token_batch(2, 8)
    reused = thunder_core.examine(model, idx)
    separate = thunder_core.examine(model, idx, jit_options={"reuse_blocks": False})
    assert reused.native == separate.native and reused.opaque == separate.opaque


def test_examine_reports_what_it_cannot_compile_instead_of_raising():
    def branches_on_data(x):
        if x.sum() > 0:
            return x * 2
        return x

    found = thunder_core.examine(branches_on_data, torch.ones(3))
    assert "DataDependentError" in found.error and found.matches_eager is None
    assert "could not compile or run" in str(found)


class _Normed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(self.linear(x)).tanh()


def test_examine_of_a_jitted_method_leaves_the_module_alone_and_keeps_its_options():
    torch.manual_seed(0)
    model = _Normed()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    jitted = thunder_core.jit(model.forward, executors=["torch"])
    found = thunder_core.examine(jitted, torch.randn(6, 4))
    assert found.matches_eager, found.mismatch
    assert found.gradients_compared >= 4  # the linear's and the norm's parameters
    assert set(found.executors) <= {"torch", "(decomposed)"}  # the options it was jitted with
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():  # BatchNorm's running statistics included
        torch.testing.assert_close(v, before[k])
