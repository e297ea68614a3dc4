"""What may move ahead of an open run of a fusion executor's claims, or wait until after it,
checked on the run itself.

A throwaway fusion executor claims a few elementwise ops; the trace is claimed and run
directly, against eager PyTorch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from thunder_core import FusionExecutor
from thunder_core.capture.capture import capture
from thunder_core.executors import torch_executor
from thunder_core.executors.claiming import assign_executors


class TraceRegions(FusionExecutor):
    """Runs each region as the trace of its operations."""

    def compile_region(self, region):
        return region.as_trace("region").python_callable()


def _claimed(fn, args, claim_also=()):
    executor = TraceRegions("trace_regions")
    for name in ("add", "mul", "exp", "mean", "silu", "sin", "cos", "tanh", *claim_also):
        executor.register_supported(name)
    names = [f"a{i}" for i in range(len(args))]
    trace, _ = capture(fn, args, {}, positional_names=names)
    return assign_executors(trace, [executor, torch_executor.executor])


def test_an_independent_matmul_moves_ahead_and_the_claims_around_it_fuse():
    def mlp(x, gate, up):
        return F.silu(x @ gate) * (x @ up)

    args = (torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8))
    claimed = _claimed(mlp, args)
    regions = [b for b in claimed.bound_symbols if b.executor == "trace_regions"]
    assert len(regions) == 1 and {"silu", "mul"} <= {s.symbol.name for s in regions[0].subsymbols}
    torch.testing.assert_close(claimed.python_callable()(*args), mlp(*args))


def test_an_update_no_tag_announces_is_not_moved():
    """batch_norm in training updates its running statistics, an effect its symbol does not
    carry: the claims that read the old statistics run before it."""

    def stats_before_and_after(x, running_mean, running_var):
        before = (running_mean * 2).exp()
        y = F.batch_norm(x, running_mean, running_var, training=True)
        return before + y.mean(0)

    x = torch.randn(4, 3)
    claimed = _claimed(stats_before_and_after, (x, torch.zeros(3), torch.ones(3)))
    mine, reference = (torch.zeros(3), torch.ones(3)), (torch.zeros(3), torch.ones(3))
    torch.testing.assert_close(claimed.python_callable()(x, *mine), stats_before_and_after(x, *reference))
    torch.testing.assert_close(mine, reference)


def _regions(claimed) -> list[set[str]]:
    return [
        {s.symbol.name for s in b.subsymbols} for b in claimed.bound_symbols if b.executor == "trace_regions"
    ]


def test_a_matmul_reading_the_run_waits_and_the_claims_that_do_not_need_it_join_the_region():
    """The MLP backward shape: a product feeds a weight-gradient matmul, and the activation's
    derivative after that matmul does not read it: one region, then the matmul."""

    def backward_like(a, b, w):
        product = torch.sin(a) * b
        weight_grad = product @ w
        derivative = torch.cos(a) + b
        return weight_grad, derivative

    args = (torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8))
    claimed = _claimed(backward_like, args)
    assert _regions(claimed) == [{"sin", "mul", "cos", "add"}]
    order = [b.executor if b.executor == "trace_regions" else b.symbol.name for b in claimed.bound_symbols]
    assert order.index("matmul") > order.index("trace_regions")  # it runs after the region
    torch.testing.assert_close(claimed.python_callable()(*args), backward_like(*args))


def test_a_claim_reading_the_waiting_matmul_ends_the_region_before_it():
    def chain(a, b, w):
        product = torch.sin(a) * b
        projected = product @ w  # read by the next claim: it cannot wait past it
        return torch.tanh(projected) + product.exp()

    args = (torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8))
    claimed = _claimed(chain, args)
    order = [b.executor if b.executor == "trace_regions" else b.symbol.name for b in claimed.bound_symbols]
    assert order.index("matmul") < len(order) - 1 and order[order.index("matmul") + 1] == "trace_regions"
    assert {"sin", "mul"} <= _regions(claimed)[0] and "tanh" in _regions(claimed)[1]
    torch.testing.assert_close(claimed.python_callable()(*args), chain(*args))


def test_a_waiting_matmul_does_not_read_statistics_a_claimed_batch_norm_updates_after_it():
    """The matmul reads the running mean before batch_norm (claimed here) updates it in place."""

    def read_then_update(x, running_mean, running_var):
        scaled = torch.sin(x) * 2
        projected = scaled @ running_mean.unsqueeze(1)  # reads the open run and the old mean
        normalized = F.batch_norm(x, running_mean, running_var, training=True)
        return projected, normalized

    x = torch.randn(4, 3)
    claimed = _claimed(read_then_update, (x, torch.zeros(3), torch.ones(3)), claim_also=("batch_norm",))
    mine, reference = (torch.zeros(3), torch.ones(3)), (torch.zeros(3), torch.ones(3))
    torch.testing.assert_close(claimed.python_callable()(x, *mine), read_then_update(x, *reference))
    torch.testing.assert_close(mine, reference)


class FailingWithViewsAfter(FusionExecutor):
    """Moves views of its results after its regions, then fails to compile every region."""

    views_after_region = True

    def compile_region(self, region):
        raise RuntimeError("this executor cannot compile anything")


def test_a_region_that_fails_gives_back_the_views_it_moved_after_it():
    def fn(x):
        y = x.exp() * 2
        return y.reshape(2, -1), y.transpose(0, 1)  # views of the region's result, returned

    executor = FailingWithViewsAfter("failing_views")
    for name in ("exp", "mul", "reshape", "transpose"):
        executor.register_supported(name)
    x = torch.randn(4, 3)
    trace, _ = capture(fn, (x,), {}, positional_names=["x"])
    with pytest.warns(RuntimeWarning, match="failing_views"):
        claimed = assign_executors(trace, [executor, torch_executor.executor])
    assert all(b.executor == "torch" for b in claimed.bound_symbols)
    torch.testing.assert_close(claimed.python_callable()(x), fn(x))
