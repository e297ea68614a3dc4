"""Torch calls made for their effect: gradient hooks and ``retain_grad`` registered inside the
function are replayed where eager has them act (the hook sees eager's gradient on every call, its
return value replaces the gradient; ``.grad`` of a returned tensor is retained), seeding torch's
generator inside is refused, and other calls that return no tensor are refused by name, never
run once during capture and forgotten."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core.errors import CaptureError

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]
FRONT_ENDS = ["jit-torch", "jit-default", "torch.compile"]


def compiled(fn, front_end):
    if front_end == "torch.compile":
        torch._dynamo.reset()
        return torch.compile(fn, backend="thunder_core")
    return thunder_core.jit(fn, executors=["torch"] if front_end == "jit-torch" else DEFAULT_EXECUTORS)


class HookedMLP(nn.Module):
    """Hooks on an intermediate: one that records the gradient, one that scales it."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        h.register_hook(lambda g: self.seen.append(g.clone()))
        h.register_hook(lambda g: g * 3)  # replaces the gradient flowing on
        used_before = h.sum(-1, keepdim=True)  # a use of h made before the hooks fire in backward
        return self.fc2(h) + used_before


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_hooks_on_an_intermediate_see_and_change_eager_gradients(front_end):
    torch.manual_seed(0)
    model, reference = HookedMLP(), HookedMLP()
    reference.load_state_dict(model.state_dict())
    cmodel = compiled(model, front_end)
    for call in range(3):
        x = torch.randn(3, 4, requires_grad=True)
        expected = reference(x)
        expected.square().sum().backward()
        expected_x_grad, x.grad = x.grad, None
        actual = cmodel(x)
        actual.square().sum().backward()
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(x.grad, expected_x_grad)
        assert len(model.seen) == len(reference.seen) == call + 1
        torch.testing.assert_close(model.seen[-1], reference.seen[-1])
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


def hook_the_input(x, w):
    x.register_hook(lambda g: g * 2)  # registered on the caller's tensor, on every call, as in eager
    return (x @ w).sum()


@pytest.mark.parametrize("front_end", ["jit-torch", "jit-default"])
def test_a_hook_on_an_input_is_registered_on_the_real_tensor_each_call(front_end):
    w = torch.randn(3, 2)
    cfn = compiled(hook_the_input, front_end)
    x_eager, x_jit = torch.randn(4, 3, requires_grad=True), None
    x_jit = x_eager.detach().clone().requires_grad_()
    for _ in range(3):  # each call adds a hook: gradients double once more per call
        hook_the_input(x_eager, w).backward()
        cfn(x_jit, w).backward()
        torch.testing.assert_close(x_jit.grad, x_eager.grad)
    # The hooks stay on the tensor, as eager's: a later eager use of it sees all three.
    x_eager.grad = x_jit.grad = None
    (x_eager * 1).sum().backward()
    (x_jit * 1).sum().backward()
    torch.testing.assert_close(x_jit.grad, x_eager.grad)


def retain_inside(x, w):
    h = x @ w
    h.retain_grad()
    return torch.relu(h), h


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_retain_grad_of_a_returned_tensor(front_end):
    cfn = compiled(retain_inside, front_end)
    w = torch.randn(3, 5, requires_grad=True)
    for _ in range(2):
        x = torch.randn(2, 3)
        out, h = retain_inside(x, w)
        out.sum().backward()
        out_j, h_j = cfn(x, w)
        out_j.sum().backward()
        torch.testing.assert_close(h_j.grad, h.grad)


def retain_an_input(x):
    x.retain_grad()
    return (x * x).sum()


def test_retain_grad_of_a_non_leaf_input():
    base = torch.randn(4, requires_grad=True)
    jfn = thunder_core.jit(retain_an_input)
    x_eager, x_jit = base * 2, base * 2
    retain_an_input(x_eager).backward()
    jfn(x_jit).backward()
    torch.testing.assert_close(x_jit.grad, x_eager.grad)


def test_a_hook_needs_a_tensor_that_requires_grad_as_in_eager():
    def fn(x):
        y = x * 2
        y.register_hook(print)
        return y

    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        fn(torch.ones(2))
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        thunder_core.jit(fn)(torch.ones(2))


def test_a_hook_closing_over_a_traced_tensor_is_refused():
    def fn(x):
        y = x * 2
        mask = y > 0
        y.register_hook(lambda g: g * mask)
        return y.sum()

    with pytest.raises(CaptureError, match="uses .* a tensor computed inside"):
        thunder_core.jit(fn)(torch.randn(3, requires_grad=True))


def test_removing_a_hook_registered_inside_is_refused():
    def fn(x):
        y = x * 2
        y.register_hook(print).remove()
        return y

    with pytest.raises(CaptureError, match="removes a gradient hook"):
        thunder_core.jit(fn)(torch.randn(3, requires_grad=True))


def seeded_noise(x):
    torch.manual_seed(0)
    return x + torch.rand(3)


def generator_seeded_inside(x):
    g = torch.Generator().manual_seed(1)
    return x + torch.rand(3, generator=g)


@pytest.mark.parametrize("fn", [seeded_noise, generator_seeded_inside], ids=lambda f: f.__name__)
@pytest.mark.parametrize("cache", ["guarded", "same input"])
def test_seeding_inside_is_refused(fn, cache):
    with pytest.raises(CaptureError, match="sets the state of torch.s random generator"):
        thunder_core.jit(fn, cache=cache)(torch.zeros(3))


def test_seeding_inside_through_torch_compile_gives_eager_values():
    torch._dynamo.reset()
    cfn = torch.compile(seeded_noise, backend="thunder_core")
    for _ in range(2):
        torch.testing.assert_close(cfn(torch.zeros(3)), seeded_noise(torch.zeros(3)))


def test_backward_inside_is_refused_with_the_way_out():
    def step(x, w):
        loss = (x @ w).sum()
        loss.backward()
        return loss

    with pytest.raises(CaptureError, match="calls backward inside a jitted function"):
        thunder_core.jit(step)(torch.randn(2, 3), torch.randn(3, 1, requires_grad=True))


@pytest.mark.parametrize(
    "call",
    [
        lambda y: y.grad,
        lambda y: y.grad_fn,
    ],
    ids=["grad", "grad_fn"],
)
def test_other_calls_returning_no_tensor_are_refused(call):
    def fn(x):
        call(x)
        return x * 2

    with pytest.raises(CaptureError, match="returns .* no tensor while capturing"):
        thunder_core.jit(fn)(torch.randn(3, requires_grad=True))


def test_the_trace_shows_the_hook():
    def fn(x):
        x.register_hook(print)
        return x * 2

    jfn = thunder_core.jit(fn)
    jfn(torch.randn(2, requires_grad=True))
    (forward,) = [t for t in thunder_core.last_traces(jfn) if t.function_name == "forward"][-1:]
    assert "torch.Tensor.register_hook(x, _" in str(forward)


@torch.library.custom_op("thunder_core_tests::double_and_total", mutates_args=("x",))
def _double_and_total(x: torch.Tensor) -> torch.Tensor:
    """A custom op that doubles its input in place and returns the new total."""
    x.mul_(2)
    return x.sum().reshape(1)


@_double_and_total.register_fake
def _(x):
    return x.new_empty(1)


def test_an_opaque_op_whose_schema_mutates_its_input_is_kept_in_order():
    """A name without a trailing underscore, but ``mutates_args`` in its schema: the update is
    neither dropped (its result is unused) nor moved, and later reads see the doubled tensor."""

    def update_then_read(x):
        _double_and_total(x)
        return x * 2

    x, reference = torch.ones(3), torch.ones(3)
    jfn = thunder_core.jit(update_then_read)
    torch.testing.assert_close(jfn(x), update_then_read(reference))
    torch.testing.assert_close(x, reference)
    torch.testing.assert_close(jfn(x), update_then_read(reference))  # the cached program too
    torch.testing.assert_close(x, reference)
