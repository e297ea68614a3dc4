"""Random draws: every draw eager makes is made, in eager's order, so the values and the
generator's stream after each call are eager's — unused draws included (random ops are impure:
dead-code elimination keeps them), through jit with each executor list and torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core import DataDependentError

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]
FRONT_ENDS = ["jit-torch", "jit-default", "torch.compile"]


def compiled(fn, front_end):
    if front_end == "torch.compile":
        torch._dynamo.reset()
        return torch.compile(fn, backend="thunder_core")
    executors = ["torch"] if front_end == "jit-torch" else DEFAULT_EXECUTORS
    return thunder_core.jit(fn, executors=executors)


def assert_same_draws(fn, make_args, front_end, calls=3):
    """Each call's result and the next draw after it equal eager's, from the same seed."""
    jfn = compiled(fn, front_end)
    for call in range(calls):
        torch.manual_seed(100 + call)
        expected = fn(*make_args())
        expected_next = torch.rand(4)
        torch.manual_seed(100 + call)
        actual = jfn(*make_args())
        actual_next = torch.rand(4)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(actual_next, expected_next, msg=f"the stream after call {call} differs")


def unused_draws(x):
    torch.rand(3)  # its value is unused; it still advances the generator
    noise = torch.randn_like(x)
    torch.normal(torch.zeros(2), torch.ones(2))  # a random op thunder_core runs as an opaque call
    return x + noise


def unused_draw_last(x):
    y = x * 2
    torch.randint(0, 10, (5,))
    return y


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("fn", [unused_draws, unused_draw_last], ids=lambda f: f.__name__)
def test_unused_draws_advance_the_stream_as_in_eager(fn, front_end):
    assert_same_draws(fn, lambda: (torch.ones(4),), front_end)


class DropoutModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        discarded = self.drop(x)  # noqa: F841  (an unused dropout still draws)
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


@pytest.mark.parametrize("front_end", ["jit-torch", "jit-default"])
def test_training_with_dropout_gives_eager_values_gradients_and_stream(front_end):
    torch.manual_seed(0)
    model = DropoutModel()
    reference = DropoutModel()
    reference.load_state_dict(model.state_dict())
    jmodel = thunder_core.jit(model, executors=["torch"] if front_end == "jit-torch" else DEFAULT_EXECUTORS)
    for step in range(3):
        x = torch.randn(5, 8)
        torch.manual_seed(step)
        expected = reference(x)
        expected.sum().backward()
        expected_next = torch.rand(3)
        torch.manual_seed(step)
        actual = jmodel(x)
        actual.sum().backward()
        actual_next = torch.rand(3)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(actual_next, expected_next)
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_the_final_trace_keeps_the_unused_draw():
    jfn = thunder_core.jit(unused_draw_last, executors=["torch"])
    jfn(torch.ones(3))
    assert "torch.randint" in str(thunder_core.last_traces(jfn)[-1])


def layer_drop(x, drop: float):
    """Hugging Face's layer drop (BART, OPT, Whisper, ...): a draw decides whether a layer runs."""
    for _ in range(3):
        if torch.rand([]) < drop:
            continue
        x = nn.functional.dropout(x.sin(), 0.3, training=True) + x
    return x


@pytest.mark.parametrize("front_end", ["jit-torch", "jit-default"])
@pytest.mark.parametrize("drop", [0.0, 2.0, -1.0])
def test_a_comparison_that_the_bounds_of_a_draw_decide_is_not_data_dependent(drop, front_end):
    """``torch.rand`` draws in [0, 1): ``draw < 0.0`` is False and ``draw < 2.0`` True whatever
    is drawn; the draw is still made, so the values and the stream after are eager's."""
    assert_same_draws(lambda x: layer_drop(x, drop), lambda: (torch.randn(4, 5),), front_end)


DECIDED = {
    "r < 0": lambda r: r < 0,
    "0.0 > r": lambda r: 0.0 > r,
    "r >= 0.0": lambda r: r >= 0.0,
    "r <= -1": lambda r: r <= -1,
    "r > 1.0": lambda r: r > 1.0,
    "torch.ge(r, 2.0)": lambda r: torch.ge(r, 2.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("decide", list(DECIDED.values()), ids=list(DECIDED))
def test_every_comparison_the_bounds_decide_gives_eagers_branch(decide, dtype):
    def fn(x):
        if decide(torch.rand([], dtype=dtype)):
            return x * 2
        return x - 1

    assert_same_draws(fn, lambda: (torch.randn(3),), "jit-torch")


def draw_scaled_in_place(x):
    r = torch.rand([])
    r.mul_(3)
    return x * 2 if r < 2.0 else x


def draw_scaled_through_a_view(x):
    r = torch.rand([])
    r.view(1).mul_(3)
    return x * 2 if r < 2.0 else x


def comparison_changed_in_place(x):
    c = torch.rand([]) < 0.0
    c |= x.sum() > 0
    return x * 2 if c else x


def near_zero_in_half_precision(x):
    return x * 2 if torch.rand([], dtype=torch.float16) > -1e-8 else x  # -1e-8 rounds to -0.0


@pytest.mark.parametrize(
    "fn",
    [
        draw_scaled_in_place,
        draw_scaled_through_a_view,
        comparison_changed_in_place,
        near_zero_in_half_precision,
    ],
)
def test_a_comparison_that_the_bounds_of_a_draw_do_not_decide_is_data_dependent(fn):
    with pytest.raises(DataDependentError, match="converts a tensor to a Python bool"):
        thunder_core.jit(fn)(torch.randn(3))
    with pytest.raises(DataDependentError, match="converts a tensor to a Python bool"):
        thunder_core.jit(layer_drop)(torch.randn(4, 5), 0.5)
