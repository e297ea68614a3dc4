"""Through ``torch.compile(backend="thunder_core")``: graphs that mutate their inputs in place
(also when inputs alias each other), update buffers, or call a ``torch.autograd.Function`` give
eager's results and leave the caller's tensors as eager leaves them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

EXECUTOR_LISTS = {"torch": ["torch"], "default": ["inductor", "numba", "torch"]}


def compiled(fn, executors, fallback="inductor"):
    torch._dynamo.reset()
    return torch.compile(
        fn, backend="thunder_core", options={"executors": EXECUTOR_LISTS[executors], "fallback": fallback}
    )


def add_then_read(a, b):
    a.add_(1)
    return a * b


def setitem_then_read(a, b):
    a[0] = b.sum()
    return torch.tanh(a) + b


def copy_into(a, b):
    a.copy_(b * 2)
    return a.sum() + b


def mutate_both(a, b):
    a.mul_(2)
    b.sub_(0.5)
    return a + b


CASES = [add_then_read, setitem_then_read, copy_into, mutate_both]


@pytest.mark.parametrize("fallback", ["inductor", "eager"])
@pytest.mark.parametrize("executors", list(EXECUTOR_LISTS))
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_input_mutations_reach_the_caller(fn, executors, fallback):
    cfn = compiled(fn, executors, fallback)
    for _ in range(2):
        a, b = torch.randn(4), torch.randn(4)
        a2, b2 = a.clone(), b.clone()
        expected = fn(a, b)
        actual = cfn(a2, b2)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(a2, a)
        torch.testing.assert_close(b2, b)


@pytest.mark.parametrize("executors", list(EXECUTOR_LISTS))
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_aliased_inputs(fn, executors):
    cfn = compiled(fn, executors)
    for make in (lambda t: (t, t), lambda t: (t[:4], t[2:])):  # the same tensor twice; overlapping views
        base = torch.randn(6)
        base2 = base.clone()
        expected = fn(*make(base))
        actual = cfn(*make(base2))
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(base2, base)


@pytest.mark.parametrize("executors", list(EXECUTOR_LISTS))
def test_batchnorm_running_statistics(executors):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU())
    reference = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU())
    reference.load_state_dict(model.state_dict())
    cmodel = compiled(model, executors)
    for _ in range(3):
        x = torch.randn(8, 4)
        torch.testing.assert_close(cmodel(x), reference(x))
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)
    assert model[1].num_batches_tracked == reference[1].num_batches_tracked


class ScaledSquare(torch.autograd.Function):
    """x * x with a deliberately different backward (3 g x): the user's backward must run."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * grad * x


def with_function(x, w):
    return (ScaledSquare.apply(x @ w) + 1).sum()


@pytest.mark.parametrize("executors", list(EXECUTOR_LISTS))
def test_a_graph_with_an_autograd_function(executors):
    cfn = compiled(with_function, executors)
    w = torch.randn(3, 2, requires_grad=True)
    for _ in range(2):
        x = torch.randn(4, 3, requires_grad=True)
        expected = with_function(x, w)
        expected_grads = torch.autograd.grad(expected, [x, w])
        actual = cfn(x, w)
        actual_grads = torch.autograd.grad(actual, [x, w])
        torch.testing.assert_close(actual, expected)
        for a, e in zip(actual_grads, expected_grads):
            torch.testing.assert_close(a, e)


def scale_in_place_then_train(x, w):
    y = x * 2
    y.add_(1)
    y.mul_(w)
    return y.sin().sum()


@pytest.mark.parametrize("executors", list(EXECUTOR_LISTS))
def test_training_through_in_place_updates_of_intermediates(executors):
    """In-place methods on values that need a gradient: before, the graph was split around
    them and the fallback part changed a tensor the thunder_core part had saved (autograd raised)."""
    cfn = compiled(scale_in_place_then_train, executors)
    for _ in range(2):
        x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
        expected = scale_in_place_then_train(x, w)
        expected_grads = torch.autograd.grad(expected, [x, w])
        actual = cfn(x, w)
        torch.testing.assert_close(actual, expected)
        for a, e in zip(torch.autograd.grad(actual, [x, w]), expected_grads):
            torch.testing.assert_close(a, e)


def sgd_step_then_read(p, g):
    with torch.no_grad():
        p.add_(g, alpha=-0.1)
    return (p * 2).sum()


@pytest.mark.parametrize("executors", list(EXECUTOR_LISTS))
def test_an_update_under_no_grad_of_a_leaf_that_requires_grad(executors):
    cfn = compiled(sgd_step_then_read, executors)
    p, g = torch.randn(3, requires_grad=True), torch.randn(3)
    reference = p.detach().clone().requires_grad_()
    for _ in range(2):
        actual, expected = cfn(p, g), sgd_step_then_read(reference, g)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(p, reference)
        (actual_grad,) = torch.autograd.grad(actual, p)
        (expected_grad,) = torch.autograd.grad(expected, reference)
        torch.testing.assert_close(actual_grad, expected_grad)
        assert p.is_leaf


def write_cache_then_attend(cache, position, entry, query):
    cache.index_copy_(0, position, entry)
    return torch.softmax(query @ cache.T, dim=-1) @ cache


def test_an_in_place_method_of_a_captured_operation_stays_in_the_thunder_core_part():
    """``cache.index_copy_`` (a static KV cache's write) is captured in the part around it, as
    ``jit`` captures it: no fallback part, no part boundary (each costs a decoding step its own
    calls), and the caller's cache is written as eager writes it."""
    from thunder_core.dynamo.compiler import report_for

    cfn = compiled(write_cache_then_attend, "default")
    cache, reference = torch.zeros(8, 4), torch.zeros(8, 4)
    for step in range(3):
        position, entry, query = torch.tensor([step]), torch.randn(1, 4), torch.randn(2, 4)
        torch.testing.assert_close(
            cfn(cache, position, entry, query), write_cache_then_attend(reference, position, entry, query)
        )
        torch.testing.assert_close(cache, reference)
    (graph,) = report_for(cfn).graphs
    assert [p.owner for p in graph.partitions] == ["thunder_core"]
