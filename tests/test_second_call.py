"""A recompiled program with fixed sizes compiles its fusion regions at its second call."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core import ConfigError, FusionExecutor
from thunder_core.capture.capture import capture
from thunder_core.executors import torch_executor
from thunder_core.executors.claiming import assign_executors
from thunder_core.executors.second_call import ProgramCalls, compiling_at_second_call

impl = pytest.importorskip("thunder_executor_inductor._impl", reason="the Inductor executor is not installed")


@pytest.fixture
def compiles(monkeypatch):
    """The regions the Inductor executor compiles (it keeps compiling them as it does)."""
    made = []
    real = impl.InductorExecutor.compile_region

    def counted(self, region):
        made.append(len(region.bound_symbols))
        return real(self, region)

    monkeypatch.setattr(impl.InductorExecutor, "compile_region", counted)
    monkeypatch.delenv("THUNDER_CORE_RECOMPILED_REGIONS", raising=False)
    return made


def f(x):
    return (x.exp() * 2).sin() + x


def _notes(jfn) -> list[str]:
    return [r.note for r in thunder_core.explain(jfn).for_symbol("torch.sin")]


def test_a_recompiled_program_runs_its_regions_with_torch_first_and_compiles_them_at_its_second_call(
    compiles,
):
    jfn = thunder_core.jit(f, executors=["inductor"], select="priority")
    x = torch.randn(6, 5)
    torch.testing.assert_close(jfn(x), f(x))
    first = len(compiles)
    assert first > 0  # the function's first program compiles at once
    y = x.double()  # another dtype: a program with fixed sizes of its own
    torch.testing.assert_close(jfn(y), f(y))
    assert len(compiles) == first, "a region of the recompiled program compiled at its first call"
    assert "until then torch runs its operations" in _notes(jfn)[-1]
    torch.testing.assert_close(jfn(y), f(y))
    assert len(compiles) > first
    assert "compiled before its program's second call" in _notes(jfn)[-1]
    assert thunder_core.explain(jfn).for_symbol("torch.sin")[-1].executor == "inductor"
    done = len(compiles)
    torch.testing.assert_close(jfn(y), f(y))
    torch.testing.assert_close(jfn(x), f(x))
    assert len(compiles) == done and thunder_core.cache_info(jfn).entries == 2


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return torch.sin(self.linear(x).exp() * 0.5) + x


def test_a_block_that_runs_several_times_in_the_first_call_waits_for_the_second_call(compiles):
    """The layers share one compiled block: its regions run once per layer in each call, and
    still compile only when the program is called again."""
    torch.manual_seed(0)
    model = nn.Sequential(Layer(), Layer(), Layer())
    jmodel = thunder_core.jit(model, executors=["inductor"], select="priority")
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(jmodel(x), model(x))
        first = len(compiles)
        model.double()
        y = x.double()
        torch.testing.assert_close(jmodel(y), model(y))
        assert len(compiles) == first
        assert [b.calls for b in thunder_core.last_blocks(jmodel)] == [3]  # one block, run 3 times
        torch.testing.assert_close(jmodel(y), model(y))
        assert len(compiles) > first


def test_training_gives_eager_gradients_at_the_first_and_second_call_of_a_recompiled_program(compiles):
    torch.manual_seed(0)
    model = nn.Sequential(Layer(), Layer())
    reference = nn.Sequential(Layer(), Layer())
    reference.load_state_dict(model.state_dict())
    jmodel = thunder_core.jit(model, executors=["inductor"], select="priority")
    x = torch.randn(4, 8)
    jmodel(x).sum().backward()
    first = len(compiles)
    model.double()
    reference.double()
    for call in range(2):
        model.zero_grad()
        reference.zero_grad()
        y = x.double().requires_grad_()
        y_ref = y.detach().clone().requires_grad_()
        jmodel(y).square().sum().backward()
        reference(y_ref).square().sum().backward()
        torch.testing.assert_close(y.grad, y_ref.grad)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        if call == 0:
            assert len(compiles) == first
    assert len(compiles) > first


def test_at_once_compiles_a_recompiled_program_before_its_first_call(compiles, monkeypatch):
    monkeypatch.setenv("THUNDER_CORE_RECOMPILED_REGIONS", "at_once")
    jfn = thunder_core.jit(f, executors=["inductor"], select="priority")
    x = torch.randn(6, 5)
    jfn(x)
    first = len(compiles)
    torch.testing.assert_close(jfn(x.double()), f(x.double()))
    assert len(compiles) > first


def test_a_program_with_symbolic_sizes_compiles_at_once(compiles):
    """One compile serves every size, and its compile may add size guards, which are taken with
    the program's: not left for later."""
    jfn = thunder_core.jit(f, executors=["inductor"], select="priority")
    jfn(torch.randn(6, 5))
    first = len(compiles)
    x = torch.randn(9, 5)
    torch.testing.assert_close(jfn(x), f(x))
    assert "symbolic sizes" in thunder_core.cache_info(jfn).reasons[-1]
    assert len(compiles) > first  # during that first call of the symbolic program


def test_an_unknown_value_names_the_choices(monkeypatch):
    monkeypatch.setenv("THUNDER_CORE_RECOMPILED_REGIONS", "later")
    with pytest.raises(ConfigError, match="at_second_call.*at_once"):
        thunder_core.jit(f)(torch.randn(3))


class FailingRegions(FusionExecutor):
    """Claims add, mul, exp and sin; its compile raises."""

    def __init__(self):
        super().__init__("failing")
        self.compiles = 0
        for op in ("add", "mul", "exp", "sin"):
            self.register_supported(op)

    def compile_region(self, region):
        self.compiles += 1
        raise RuntimeError("compiler crashed")


def _recompiled_program(executor, x):
    """``f`` claimed by ``executor`` as a recompiled program's regions are: the program, counted,
    and its calls."""
    trace, _ = capture(f, (x,), {}, positional_names=["x"])
    calls = ProgramCalls()
    with compiling_at_second_call(calls):
        lowered = assign_executors(trace, [executor, torch_executor.executor])
    return calls.counting(lowered.python_callable()), calls


def test_a_compile_that_fails_at_the_second_call_warns_and_leaves_the_torch_operations():
    executor = FailingRegions()
    x = torch.randn(4, 3)
    program, calls = _recompiled_program(executor, x)
    assert executor.compiles == 0
    torch.testing.assert_close(program(x), f(x))
    assert executor.compiles == 0
    with pytest.warns(RuntimeWarning, match="failing.*compiler crashed"):
        torch.testing.assert_close(program(x), f(x))
    assert executor.compiles == 1
    torch.testing.assert_close(program(x), f(x))
    assert executor.compiles == 1  # not tried again


class SlowRegions(FailingRegions):
    """Compiles each region as the trace of its operations, slowly."""

    def compile_region(self, region):
        self.compiles += 1
        time.sleep(0.2)
        return region.as_trace("region").python_callable()


def test_two_threads_making_the_second_call_at_once_compile_each_region_once():
    executor = SlowRegions()
    x = torch.randn(4, 3)
    program, calls = _recompiled_program(executor, x)
    program(x)
    calls.count = 1  # both threads below make the second call
    results = []
    threads = [threading.Thread(target=lambda: results.append(program(x))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and executor.compiles == 1
    for r in results:
        torch.testing.assert_close(r, f(x))


class InterruptedOnce(SlowRegions):
    """Its first compile is interrupted (Ctrl-C), its later ones succeed."""

    def compile_region(self, region):
        if self.compiles == 0:
            self.compiles += 1
            raise KeyboardInterrupt
        return super().compile_region(region)


def test_a_compile_interrupted_at_the_second_call_reaches_the_caller_and_is_tried_again():
    executor = InterruptedOnce()
    x = torch.randn(4, 3)
    program, calls = _recompiled_program(executor, x)
    torch.testing.assert_close(program(x), f(x))
    with pytest.raises(KeyboardInterrupt):
        program(x)
    assert calls.pending  # still to compile
    torch.testing.assert_close(program(x), f(x))
    assert executor.compiles == 2 and not calls.pending
