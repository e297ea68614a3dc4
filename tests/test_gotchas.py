"""Gotchas: programs that change something between calls, or use what real models use.

Every case runs the program eagerly and jitted, call after call, changing what eager would see
(globals, closures, module and config attributes, train/eval, hooks, torch state, parameters'
requires_grad), and asserts eager's results on every call or a clear error. Each case runs
with the torch executor alone and with the default CPU executors (Inductor, Numba).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core.errors import CaptureError

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]


@pytest.fixture(params=["torch", "default"])
def executors(request):
    """The executor lists every gotcha runs with: torch alone, and the default CPU executors."""
    return ["torch"] if request.param == "torch" else DEFAULT_EXECUTORS


def assert_same(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


# Globals and closures.
SCALE = 2.0
OFFSETS = {"bias": 1.0}


@dataclass
class Settings:
    power: int = 2
    activation: str = "relu"


SETTINGS = Settings()


def scaled(a):
    return a * SCALE + OFFSETS["bias"]


def test_a_changed_global_recompiles(executors):
    global SCALE
    jf = thunder_core.jit(scaled, executors=executors)
    x = torch.ones(3)
    try:
        for value in (2.0, 3.0, 2.0, -1.5):
            SCALE = value
            assert_same(jf(x), scaled(x))
        OFFSETS["bias"] = 5.0
        assert_same(jf(x), scaled(x))
    finally:
        SCALE, OFFSETS["bias"] = 2.0, 1.0
    assert any("SCALE" in r for r in thunder_core.cache_info(jf).reasons)
    assert any("OFFSETS" in r for r in thunder_core.cache_info(jf).reasons)


def test_the_issue_example_global_in_a_lambda():
    namespace = {"torch": torch}
    exec("scale = 2.0\nfn = lambda a: a * scale", namespace)
    jf = thunder_core.jit(namespace["fn"])
    assert_same(jf(torch.ones(3)), torch.full((3,), 2.0))
    namespace["scale"] = 3.0
    assert_same(jf(torch.ones(3)), torch.full((3,), 3.0))


def test_a_changed_closure_variable_recompiles(executors):
    scale = 2

    def fn(a):
        return a * scale

    jf = thunder_core.jit(fn, executors=executors)
    x = torch.arange(4.0)
    for value in (2, 5, 2.5):
        scale = value
        assert_same(jf(x), fn(x))
    assert "scale (closure of" in thunder_core.cache_info(jf).reasons[-1]


def test_global_config_object_attribute(executors):
    def fn(a):
        y = a**SETTINGS.power
        return torch.relu(y) if SETTINGS.activation == "relu" else torch.tanh(y)

    jf = thunder_core.jit(fn, executors=executors)
    x = torch.randn(5)
    try:
        for power, activation in ((2, "relu"), (3, "relu"), (3, "tanh")):
            SETTINGS.power, SETTINGS.activation = power, activation
            assert_same(jf(x), fn(x))
    finally:
        SETTINGS.power, SETTINGS.activation = 2, "relu"


def test_a_helper_function_reads_a_global():
    def helper(a):
        return a + SCALE

    def fn(a):
        return helper(a) * 2

    global SCALE
    jf = thunder_core.jit(fn)
    x = torch.zeros(2)
    try:
        assert_same(jf(x), fn(x))
        SCALE = 10.0
        assert_same(jf(x), fn(x))
    finally:
        SCALE = 2.0


def test_function_defaults_and_partial(executors):
    def fn(a, *, factor=2.0):
        return a * factor

    jf = thunder_core.jit(functools.partial(fn, factor=3.0), executors=executors)
    x = torch.ones(2)
    assert_same(jf(x), x * 3.0)
    jf.__wrapped__.keywords["factor"] = 4.0
    assert_same(jf(x), x * 4.0)


# Modules.
class Configured(nn.Module):
    def __init__(self):
        super().__init__()
        self.settings = Settings()
        self.linear = nn.Linear(4, 4)
        self.power = 2
        self.gain = 1.0

    def forward(self, x):
        y = self.linear(x) ** self.power * self.gain
        return torch.relu(y) if self.settings.activation == "relu" else torch.tanh(y)


def test_module_and_config_attributes_recompile(executors):
    torch.manual_seed(0)
    model = Configured()
    jm = thunder_core.jit(model, executors=executors)
    x = torch.randn(3, 4)
    changes = [
        lambda: None,
        lambda: setattr(model, "power", 3),
        lambda: setattr(model, "gain", 0.5),
        lambda: setattr(model.settings, "activation", "tanh"),
        lambda: setattr(model, "settings", Settings(activation="relu")),
    ]
    for change in changes:
        change()
        assert_same(jm(x), model(x))
    reasons = thunder_core.cache_info(jm).reasons
    assert reasons[0] == "first call"
    assert "model.power: 2 -> 3" in reasons[1]
    assert "model.settings.activation" in reasons[3]


def test_train_eval_of_a_submodule(executors):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    jm = thunder_core.jit(model, executors=executors)
    x = torch.randn(16, 8)
    model.eval()
    assert_same(jm(x), model(x))
    model[1].train()  # only the dropout
    out = jm(x)
    assert not torch.equal(out, model.eval()(x)), "dropout must be active again"
    model[1].p = 0.0  # a dropout probability of 0 is the identity, in train mode too
    model[1].train()
    assert_same(jm(x), model.eval()(x))


def test_counter_in_forward_is_seen_every_call():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    eager, jitted = Counting(), Counting()
    jm = thunder_core.jit(jitted, recompile_limit=4)
    x = torch.ones(2)
    with pytest.warns(UserWarning, match="calls"):
        for _ in range(6):
            assert_same(jm(x), eager(x))
    assert jitted.calls == eager.calls == 6


# Torch state.
def test_default_dtype_and_autocast_and_grad_mode(executors):
    def fn(a):
        return (a @ a.T).relu(), torch.ones(a.shape[0])

    jf = thunder_core.jit(fn, executors=executors)
    x = torch.randn(4, 4)
    assert jf(x)[0].dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert jf(x)[0].dtype == fn(x)[0].dtype == torch.bfloat16
        assert_same(jf(x), fn(x))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert jf(x)[1].dtype == torch.float64
        assert_same(jf(x), fn(x))
    finally:
        torch.set_default_dtype(previous)
    w = torch.randn(4, 4, requires_grad=True)
    with torch.no_grad():
        assert not jf(w)[0].requires_grad
    assert jf(w)[0].requires_grad


def test_no_grad_and_enable_grad_regions_inside(executors):
    def fn(w, x):
        with torch.no_grad():
            scale = (w * w).sum()
        return (x @ w * scale).sum()

    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    jf = thunder_core.jit(fn, executors=executors)
    (expected,) = torch.autograd.grad(fn(w, x), w)
    (actual,) = torch.autograd.grad(jf(w, x), w)
    assert_same(actual, expected)


def test_an_update_under_no_grad_of_a_tensor_that_requires_grad(executors):
    """An optimizer-like step and an EMA of a weight inside the function: eager allows the
    in-place update of a leaf that requires grad only under no_grad, and records no gradient
    through it. The jitted function ran it with grad mode on (and raised)."""

    class WithAverage(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3)
            self.register_buffer("average", torch.zeros(3, 3))

        def forward(self, x, lr: float):
            with torch.no_grad():
                self.average.mul_(0.9).add_(self.linear.weight, alpha=0.1)
                self.linear.weight.sub_(self.linear.weight.sign(), alpha=lr)
            return self.linear(x).sum() + (self.average * x[:3]).sum()

    torch.manual_seed(0)
    model, reference = WithAverage(), WithAverage()
    reference.load_state_dict(model.state_dict())
    jm = thunder_core.jit(model, executors=executors)
    for _ in range(3):
        x = torch.randn(3, 3)
        actual, expected = jm(x, 0.01), reference(x, 0.01)
        assert_same(actual, expected)
        actual.backward()
        expected.backward()
        assert model.linear.weight.is_leaf
        for mine, theirs in zip(model.parameters(), reference.parameters()):
            assert_same(mine, theirs)
            assert_same(mine.grad, theirs.grad)
        assert_same(model.average, reference.average)


def test_a_value_computed_under_no_grad_stays_out_of_a_gradient_pytorch_autograd_records(executors):
    """An in-place op on a value that needs a gradient makes PyTorch autograd record the whole
    program (``explain`` says so): what eager computed under no_grad must stay out of that
    recording, or the gradient silently gains the norm's derivative."""

    def fn(x):
        with torch.no_grad():
            scale = x.norm()
        y = x * 2
        y.add_(1)
        return y / scale

    x = torch.randn(5, requires_grad=True)
    jf = thunder_core.jit(fn, executors=executors)
    (expected,) = torch.autograd.grad(fn(x).sum(), x)
    (actual,) = torch.autograd.grad(jf(x).sum(), x)
    assert_same(actual, expected)
    assert any("PyTorch autograd records the whole program" in n for n in thunder_core.explain(jf).notes)


def _setitem_then_view_as(w, m):
    buf = torch.zeros(2, 3)
    buf[0] = w  # buf needs a gradient now, though the call returns nothing
    return buf.view_as(m).sum() + (w * 2).sum()


def _setitem_then_scale_under_no_grad(w, m):
    buf = torch.zeros(2, 3)
    buf[0] = w
    with torch.no_grad():
        buf.mul_(2)  # autograd does not see it: w's gradient stays 1
    return buf.sum() + m.sum()


def _region_under_no_grad(w, m):
    with torch.no_grad():
        y = m @ w.T
    return y  # requires no grad, as in eager


def _update_of_a_value_the_gradient_reads(w, m):
    y = m @ w.T
    with torch.no_grad():
        w.sub_(1.0)  # eager's backward raises: w was saved by the matmul
    return y.sum()


def _update_through_the_base_of_a_saved_view(w, m):
    y = m * w[0]
    with torch.no_grad():
        w.T.mul_(0.5)  # eager's backward raises: a view of w was saved
    return y.sum()


def _cache_written_after_attention_read_it(w, m):
    scores = m @ w.T
    with torch.no_grad():
        w.detach().index_copy_(0, torch.tensor([0]), m[:1])
    return scores.sum()


@pytest.mark.parametrize(
    "fn",
    [
        _setitem_then_view_as,
        _setitem_then_scale_under_no_grad,
        _region_under_no_grad,
        _update_of_a_value_the_gradient_reads,
        _update_through_the_base_of_a_saved_view,
        _cache_written_after_attention_read_it,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_grad_mode_regions_match_eager_where_requires_grad_is_set_late(fn, executors):
    """Which operations ran under no_grad is recorded as capture runs them, not read from
    proxies' requires_grad (``buf[0] = w`` makes ``buf`` need a gradient without returning it)."""

    def outcome(f, w, m):
        try:
            out = f(w, m)
            if out.requires_grad:
                out.sum().backward()
            return out.detach(), out.requires_grad, w.grad, m.grad
        except RuntimeError as error:
            return type(error)

    torch.manual_seed(0)
    w, m = torch.randn(3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    if fn is not _setitem_then_view_as and fn is not _setitem_then_scale_under_no_grad:
        w = torch.randn(3, 3, requires_grad=True)
    mine = [t.detach().clone().requires_grad_() for t in (w, m)]
    expected = outcome(fn, w, m)
    actual = outcome(thunder_core.jit(fn, executors=executors), *mine)
    if isinstance(expected, type):
        assert actual is expected
        return
    assert actual[1] == expected[1]
    for a, e in zip(actual[:1] + actual[2:], expected[:1] + expected[2:]):
        assert (a is None) == (e is None)
        if e is not None:
            assert_same(a, e)


@pytest.mark.parametrize(
    "update",
    [
        lambda m: m.view(-1).mul_(0),
        lambda m: m.T.mul_(0),
        lambda m: m.index_copy_(0, torch.tensor([0]), m[1:2] * 0),
    ],
    ids=["through-view", "through-T", "index_copy"],
)
def test_an_update_of_a_value_a_gradient_reads_raises_as_in_eager(update, executors):
    """The compiled backward would read the updated value (a silently wrong gradient); eager's
    autograd raises at backward, and so does the program PyTorch autograd records instead."""

    def fn(x, m):
        y = x * m
        update(m)
        return y.sum()

    x, m = torch.randn(2, 2, requires_grad=True), torch.randn(2, 2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        fn(x, m.clone()).backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        thunder_core.jit(fn, executors=executors)(x, m.clone()).backward()


def test_operations_of_a_no_grad_region_are_claimed_as_any_other():
    """They run under no_grad when the torch executor runs them; a fusion executor fuses them
    as it would outside the region (an evaluation step inside a function called with grad on)."""

    def evaluate(x, w):
        with torch.no_grad():
            return torch.nn.functional.gelu(x @ w * 2 + 1).sum(-1)

    x, w = torch.randn(16, 16), torch.randn(16, 16, requires_grad=True)
    jf = thunder_core.jit(evaluate, executors=DEFAULT_EXECUTORS)
    out = jf(x, w)
    assert_same(out, evaluate(x, w))
    assert not out.requires_grad
    explanation = thunder_core.explain(jf)
    (mul,) = explanation.for_symbol("_no_grad_torch_mul")  # as the trace calls it
    assert mul.executor in ("inductor", "(decomposed)")  # its prims then: fused
    assert {r.executor for r in explanation.for_symbol("prims.mul")} == {"inductor"}


# Hooks.
def test_forward_hooks_registered_after_jit_and_removed(executors):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    jm = thunder_core.jit(model, executors=executors)
    x = torch.randn(3, 4)
    assert_same(jm(x), model(x))
    handle = model[0].register_forward_hook(lambda m, inputs, out: out * 10)
    pre = model[2].register_forward_pre_hook(lambda m, inputs: (inputs[0] + 1,))
    assert_same(jm(x), model(x))
    handle.remove()
    assert_same(jm(x), model(x))
    pre.remove()
    assert_same(jm(x), model(x))
    assert thunder_core.cache_info(jm).entries >= 3


def test_a_hook_registered_before_jit():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    model.register_forward_hook(lambda m, inputs, out: out.relu())
    jm = thunder_core.jit(model)
    x = torch.randn(5, 3)
    assert_same(jm(x), model(x))
    assert (jm(x) >= 0).all()


# Parameters and tensors that are not parameters.
def test_requires_grad_toggled_on_parameters(executors):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    reference = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    reference.load_state_dict(model.state_dict())
    jm = thunder_core.jit(model, executors=executors)
    x = torch.randn(6, 4)
    for frozen in (False, True, False):
        for m in (model, reference):
            m[0].weight.requires_grad_(not frozen)
            m.zero_grad()
        jm(x).sum().backward()
        reference(x).sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            if q.grad is None:
                assert p.grad is None
            else:
                assert_same(p.grad, q.grad)


class Masked(nn.Module):
    """Holds a plain tensor attribute (not a parameter or buffer), like litgpt's mask_cache."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.mask = torch.ones(4)

    def forward(self, x):
        return self.linear(x) * self.mask + 1


def test_plain_tensor_attribute_is_read_live_and_guarded(executors):
    torch.manual_seed(0)
    model = Masked()
    jm = thunder_core.jit(model, executors=executors)
    x = torch.randn(2, 4)
    assert_same(jm(x), model(x))
    model.mask[0] = 0.0  # in place: the trace reads the tensor's current data
    assert_same(jm(x), model(x))
    model.mask = torch.full((4,), 3.0)  # a new tensor: recompiles
    assert_same(jm(x), model(x))
    model.mask = torch.full((1,), 2.0)  # another shape
    assert_same(jm(x), model(x))
    assert "mask" in thunder_core.cache_info(jm).reasons[-1]
    trace = thunder_core.last_traces(jm)[-1]
    assert any("mask" in p.name for p in trace.inputs)


GLOBAL_TABLE = torch.arange(6.0)


def test_global_and_closure_tensors(executors):
    table = torch.ones(6)

    def fn(x):
        return x * GLOBAL_TABLE + table

    jf = thunder_core.jit(fn, executors=executors)
    x = torch.randn(6)
    assert_same(jf(x), fn(x))
    table.mul_(2)
    GLOBAL_TABLE.add_(1)
    assert_same(jf(x), fn(x))
    table = torch.zeros(6)  # noqa: F841  (rebinds the closure cell)
    assert_same(jf(x), fn(x))
    GLOBAL_TABLE.sub_(1)


def test_global_tensor_that_requires_grad_gets_its_gradient():
    w = torch.randn(3, requires_grad=True)

    def fn(x):
        return (x * w).sum()

    x = torch.randn(3)
    thunder_core.jit(fn)(x).backward()
    assert_same(w.grad, x)


# Side effects that cannot be replayed.
def test_assigning_a_buffer_is_a_clear_error():
    class Ema(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("average", torch.zeros(3))

        def forward(self, x):
            self.average = self.average * 0.9 + x * 0.1
            return self.average

    with pytest.raises(CaptureError, match="average.*in place"):
        thunder_core.jit(Ema())(torch.ones(3))


def test_storing_a_traced_tensor_in_an_attribute_is_a_clear_error():
    class Caching(nn.Module):
        def forward(self, x):
            self.last = x * 2
            return self.last + 1

    with pytest.raises(CaptureError, match="last"):
        thunder_core.jit(Caching())(torch.ones(3))


def test_cache_same_input_skips_guards():
    namespace = {}
    exec("scale = 2.0\ndef fn(a):\n    return a * scale\n", namespace)
    jf = thunder_core.jit(namespace["fn"], cache="same input")
    assert_same(jf(torch.ones(2)), torch.full((2,), 2.0))
    namespace["scale"] = 3.0
    assert_same(jf(torch.ones(2)), torch.full((2,), 2.0))  # the documented risk of the opt-out
    with pytest.raises(ValueError, match="cache="):
        thunder_core.jit(namespace["fn"], cache="sometimes")


def test_python_random_in_the_function_is_a_clear_error():
    import random

    def stochastic_depth(x):
        return x if random.random() < 0.5 else x * 0

    with pytest.raises(CaptureError, match=r"random module \(random\).*torch.rand"):
        thunder_core.jit(stochastic_depth)(torch.ones(2))


def test_draws_from_generator_objects_are_clear_errors_and_seeding_is_not():
    import random

    import numpy as np

    rng, np_rng = random.Random(0), np.random.default_rng(0)
    cases = [
        (lambda x: x * rng.gauss(0, 1), r"random module \(random\)"),  # gauss is Python calling random()
        (lambda x: x * float(np_rng.normal()), r"NumPy's random generator np_rng"),
        (lambda x: x * float(np.random.rand()), r"NumPy's global random generator"),
    ]
    for fn, message in cases:
        with pytest.raises(CaptureError, match=message):
            thunder_core.jit(fn)(torch.ones(2))

    def seeded(x):
        rng.seed(1)  # seeding draws nothing
        return x + 1

    assert_same(thunder_core.jit(seeded)(torch.ones(2)), torch.full((2,), 2.0))


def test_jit_inside_jit_is_inlined(executors):
    inner = thunder_core.jit(lambda x: x.sin() * 2, executors=executors)
    x = torch.randn(3)
    inner(x)  # compiled on its own first: a cached entry must not run on the outer capture's stand-ins
    outer = thunder_core.jit(lambda x: inner(x) + 1, executors=executors)
    assert_same(outer(x), x.sin() * 2 + 1)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = thunder_core.jit(nn.Linear(3, 3), executors=executors)
            self.out = nn.Linear(3, 1)

        def forward(self, x):
            return self.out(self.inner(x).relu())

    torch.manual_seed(0)
    model = Outer()
    x = torch.randn(4, 3)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    thunder_core.jit(model, executors=executors)(x).sum().backward()
    for p, g in zip(model.parameters(), expected):
        assert_same(p.grad, g)


def test_enable_grad_inside_a_function_called_under_no_grad(executors):
    def fn(w, x):
        frozen = w * x
        with torch.enable_grad():
            tracked = (w * x).sum()
        return frozen, tracked

    w, x = torch.randn(3, requires_grad=True), torch.randn(3)
    jf = thunder_core.jit(fn, executors=executors)
    with torch.no_grad():
        (frozen, tracked), (eager_frozen, eager_tracked) = jf(w, x), fn(w, x)
    assert (frozen.requires_grad, tracked.requires_grad) == (
        eager_frozen.requires_grad,
        eager_tracked.requires_grad,
    )
    (grad,) = torch.autograd.grad(tracked, w)
    assert_same(grad, x)


class ClassConfig:
    scale = 2.0

    def __init__(self):
        self.offset = 1.0


class ClassScaled(nn.Module):
    bias_value = 0.5

    def __init__(self):
        super().__init__()
        self.cfg = ClassConfig()

    def forward(self, x):
        return x * self.cfg.scale + self.cfg.offset + self.bias_value


def test_class_attributes_and_monkeypatched_methods():
    model = ClassScaled()
    jm = thunder_core.jit(model)
    x = torch.ones(2)
    original = ClassScaled.forward
    try:
        assert_same(jm(x), model(x))
        ClassConfig.scale = 5.0  # a class attribute of a config read through an instance
        assert_same(jm(x), model(x))
        ClassScaled.bias_value = -1.0
        assert_same(jm(x), model(x))
        ClassScaled.forward = lambda self, x: x - 1  # the method itself replaced on the class
        assert_same(jm(x), model(x))
    finally:
        ClassConfig.scale, ClassScaled.bias_value, ClassScaled.forward = 2.0, 0.5, original


def test_too_much_state_to_guard_runs_eagerly_with_a_warning(monkeypatch):
    from thunder_core.jit import guards

    monkeypatch.setattr(guards, "MAX_CHECKS", 20)
    table = {f"k{i}": float(i) for i in range(100)}

    def fn(x):
        return x * table["k3"]

    jf = thunder_core.jit(fn)
    with pytest.warns(UserWarning, match="runs eagerly"):
        assert_same(jf(torch.ones(2)), torch.full((2,), 3.0))
    table["k3"] = 5.0
    assert_same(jf(torch.ones(2)), torch.full((2,), 5.0))  # eager: never stale


def test_numpy_arrays_read_by_the_function_are_guarded_by_value():
    import numpy as np

    weights = np.array([1.0, 2.0, 3.0], dtype=np.float32)

    def fn(x):
        return x * torch.from_numpy(weights)

    jf = thunder_core.jit(fn)
    x = torch.ones(3)
    assert_same(jf(x), fn(x))
    weights[0] = 10.0  # changed in place
    assert_same(jf(x), fn(x))
    assert "values of weights" in thunder_core.cache_info(jf).reasons[-1]

    big = np.ones(100_000, dtype=np.float32)
    jg = thunder_core.jit(lambda t: t + torch.tensor(big)[: t.shape[0]])  # a copy: baked in, unless guarded
    with pytest.warns(UserWarning, match="NumPy array of 100000 elements.*runs eagerly"):
        assert_same(jg(x), x + 1)
    big[:3] = 5.0
    assert_same(jg(x), x + 5)
