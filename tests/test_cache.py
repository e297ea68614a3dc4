"""The cache of compiled traces: what it is keyed on and how it reports."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import thunder_core


def add(a, b):
    return a + b


def test_hits_misses_and_entries():
    jfn = thunder_core.jit(add)
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    for _ in range(3):
        jfn(a, b)
    info = thunder_core.cache_info(jfn)
    assert (info.hits, info.misses, info.entries) == (2, 1, 1)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: torch.randn(4, 3),  # shape
        lambda t: t.double(),  # dtype
        lambda t: t.clone().requires_grad_(),  # requires_grad
    ],
    ids=["shape", "dtype", "requires_grad"],
)
def test_a_change_of_metadata_recompiles(change):
    jfn = thunder_core.jit(lambda a: a * 2)
    a = torch.randn(2, 3)
    jfn(a)
    b = change(a)
    torch.testing.assert_close(jfn(b), b * 2)
    assert thunder_core.cache_info(jfn).entries == 2


def test_device_is_part_of_the_key():
    from thunder_core.jit.cache_key import add_to_key

    keys = []
    for device in ("cpu", "meta"):
        key: list = []
        add_to_key(torch.empty(2, device=device), key, [], "x")
        keys.append(tuple(key))
    assert keys[0] != keys[1]


def test_grad_mode_recompiles():
    jfn = thunder_core.jit(add)
    a, b = torch.randn(2), torch.randn(2, requires_grad=True)
    assert jfn(a, b).requires_grad
    with torch.no_grad():
        assert not jfn(a, b).requires_grad
    assert thunder_core.cache_info(jfn).entries == 2


def test_python_values_are_specialized_and_keyed():
    jfn = thunder_core.jit(lambda x, n, mode: x * n if mode == "mul" else x + n)
    x = torch.randn(3)
    torch.testing.assert_close(jfn(x, 2, "mul"), x * 2)
    torch.testing.assert_close(jfn(x, 3, "mul"), x * 3)
    torch.testing.assert_close(jfn(x, 3, "add"), x + 3)
    torch.testing.assert_close(jfn(x, 3.0, "add"), x + 3.0)  # int and float are different keys
    assert thunder_core.cache_info(jfn).entries == 4


def test_recompile_limit_warns_with_what_kept_changing_and_stays_correct():
    jfn = thunder_core.jit(add, recompile_limit=2, dynamic=False)  # each size compiles
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 6):
            a, b = torch.randn(n), torch.randn(n)
            torch.testing.assert_close(jfn(a, b), a + b)
    messages = [str(w.message) for w in caught if "recompile_limit" in str(w.message)]
    assert len(messages) == 1
    assert "a: tensor (2,)" in messages[0] and "-> tensor (3,)" in messages[0]
    assert thunder_core.cache_info(jfn).entries == 2


def test_cached_call_runs_the_generated_code_not_the_python_function():
    import sys

    entered = []

    def fn(x):
        return x + 1

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is fn.__code__:
            entered.append(1)

    jfn = thunder_core.jit(fn)
    sys.setprofile(profile)
    try:
        for _ in range(5):
            jfn(torch.randn(3))
    finally:
        sys.setprofile(None)
    assert len(entered) == 1  # only the capture ran the Python function


def test_recording_an_op_runs_without_the_capture_hook_while_user_code_stays_watched():
    """Capture watches the user's code through ``sys.setprofile`` (a global read on first entry,
    a random draw); recording each op (decompositions, metadata on meta tensors) is thunder_core's
    own code and runs without that hook, which otherwise dominated capture time."""
    import sys

    seen = {"user": 0, "recording": 0}

    def helper(x):
        return torch.nn.functional.gelu(x) * OFFSET

    def fn(x):
        return helper(x).softmax(-1)

    def profile(frame, event, arg):
        if event != "call":
            return
        if frame.f_code is helper.__code__:
            seen["user"] += 1
        elif "thunder_core" in frame.f_code.co_filename and any(
            part in frame.f_code.co_filename for part in ("capture/meta.py", "ops/prims.py", "ops/nn.py")
        ):  # computing metadata, decomposing
            seen["recording"] += 1

    jfn = thunder_core.jit(fn)
    x = torch.randn(4, 8)
    sys.setprofile(profile)
    try:
        out = jfn(x)
    finally:
        sys.setprofile(None)
    torch.testing.assert_close(out, fn(x))
    assert seen["user"] == 1  # the user's profiler still sees the user's calls during capture
    assert seen["recording"] == 0
    globals()["OFFSET"] = 3.0  # the global read inside the helper is still guarded
    try:
        torch.testing.assert_close(jfn(x), fn(x))
    finally:
        globals()["OFFSET"] = 2.0
    assert thunder_core.cache_info(jfn).misses == 2


OFFSET = 2.0


def test_a_first_call_under_cprofile_compiles_and_the_profiler_keeps_recording():
    import cProfile
    import pstats

    scale = 3.0

    def fn(x):
        return x * scale

    def outside(x):
        return x + 1

    jfn = thunder_core.jit(fn)
    x = torch.randn(4)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        out = jfn(x)
        outside(x)
    finally:
        profiler.disable()
    torch.testing.assert_close(out, x * 3.0)
    recorded = {name for (_, _, name) in pstats.Stats(profiler).stats}
    assert "outside" in recorded  # resumed after the capture paused it


def _layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        *(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(3))
    )


def _train_over_sizes_like_eager(jmodel, model, reference, during):
    for n in (3, 5, 9):
        x = torch.randn(n, 8)
        with during():
            jmodel(x).square().sum().backward()
        reference(x).square().sum().backward()
        for got, want in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(got.grad, want.grad)
    assert (
        thunder_core.cache_info(jmodel).misses == 2
    )  # the second size compiled symbolic, for every later one


@pytest.mark.parametrize("capture_blocks_once", [False, True])
def test_training_under_cprofile_over_changing_sizes_gives_eagers_gradients(capture_blocks_once):
    """Autodiff and symbolic recompiles record operations outside capture: under cProfile, whose
    object ``sys.getprofile()`` returns, they once put that object back with ``sys.setprofile``
    and every later Python call raised "'Profile' object is not callable"."""
    import cProfile
    import pstats

    def outside():
        return 1

    profiler = cProfile.Profile()

    @contextlib.contextmanager
    def profiled():
        profiler.enable()
        try:
            yield
            outside()
        finally:
            profiler.disable()

    model, reference = _layers(), _layers()
    jmodel = thunder_core.jit(model, capture_blocks_once=capture_blocks_once)
    _train_over_sizes_like_eager(jmodel, model, reference, profiled)
    assert "outside" in {name for (_, _, name) in pstats.Stats(profiler).stats}


def test_compiling_under_torch_profiler_with_stacks_keeps_its_tracer_and_refuses_random_draws():
    """``torch.profiler`` with ``with_stack=True`` installs a C-level profiler that can be neither
    chained nor put back: capture watches the user's code through ``sys.settrace`` instead and
    leaves the profiler's tracer in place."""
    import random
    import sys

    from torch.profiler import ProfilerActivity, profile

    model, reference = _layers(), _layers()
    jmodel = thunder_core.jit(model)
    trace_function = sys.gettrace()  # None, or a debugger's or coverage's
    with profile(activities=[ProfilerActivity.CPU], with_stack=True):
        tracer = sys.getprofile()
        _train_over_sizes_like_eager(jmodel, model, reference, contextlib.nullcontext)
        assert sys.getprofile() is tracer
        assert sys.gettrace() is trace_function

        jfn = thunder_core.jit(lambda x: x * random.random())
        with pytest.raises(thunder_core.CaptureError, match="random module"):
            jfn(torch.ones(2))

        def seeded(x):
            torch.manual_seed(0)
            return x + 1

        with pytest.raises(thunder_core.CaptureError, match="manual_seed"):
            thunder_core.jit(seeded)(torch.ones(2))


def test_a_function_that_changes_state_it_reads_recompiles_like_eager_runs_it():
    calls = []

    def fn(x):
        calls.append(1)
        return x + len(calls)

    jfn = thunder_core.jit(fn)
    for i in range(1, 5):
        torch.testing.assert_close(jfn(torch.zeros(3)), torch.full((3,), float(i)))
    assert len(calls) == 4


def test_two_threads_compiling_at_once_do_not_interfere():
    import threading

    def first(a):
        return (a * 2).sin()

    def second(a, b):
        return a @ b + 1

    errors = []

    def run(fn, make_args, expected):
        try:
            for i in range(12):
                args = make_args(i)
                jfn = thunder_core.jit(fn)
                torch.testing.assert_close(jfn(*args), expected(*args))
        except Exception as error:  # reported below, in the main thread
            errors.append(error)

    threads = [
        threading.Thread(target=run, args=(first, lambda i: (torch.randn(i + 1),), first)),
        threading.Thread(
            target=run, args=(second, lambda i: (torch.randn(2, i + 1), torch.randn(i + 1, 3)), second)
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


class _Scale(torch.nn.Module):
    def __init__(self, factor, features=4):
        super().__init__()
        self.factor = factor
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        return self.linear(x) * self.factor


class _Holder(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) + 1


def test_a_replaced_submodule_is_used_and_recompiles_only_when_it_differs():
    torch.manual_seed(0)
    model = _Holder(_Scale(2.0))
    jmodel = thunder_core.jit(model)
    x = torch.randn(3, 4)
    torch.testing.assert_close(jmodel(x), model(x))

    model.inner = _Scale(2.0)  # equal, with new weights: reused, and the new weights are read
    torch.testing.assert_close(jmodel(x), model(x))
    assert thunder_core.cache_info(jmodel).entries == 1

    model.inner = _Scale(3.0)  # a value the forward reads differs: recompiled
    torch.testing.assert_close(jmodel(x), model(x))
    assert thunder_core.cache_info(jmodel).entries == 2
    assert "model.inner" in thunder_core.cache_info(jmodel).reasons[-1]

    class _Other(_Scale):
        def forward(self, x):
            return self.linear(x) - self.factor

    model.inner = _Other(3.0)  # another class: recompiled
    torch.testing.assert_close(jmodel(x), model(x))
    assert thunder_core.cache_info(jmodel).entries == 3

    model.inner = _Scale(3.0)  # like the second entry again: reused
    torch.testing.assert_close(jmodel(x), model(x))
    assert thunder_core.cache_info(jmodel).entries == 3


class _WithTable(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.table = table  # a plain tensor attribute: the trace reads it as a lifted input

    def forward(self, x):
        return x * self.table


def test_a_replaced_submodule_holding_another_plain_tensor_recompiles():
    model = _Holder(_WithTable(torch.full((4,), 2.0)))
    jmodel = thunder_core.jit(model)
    x = torch.randn(3, 4)
    torch.testing.assert_close(jmodel(x), model(x))
    model.inner = _WithTable(torch.full((4,), 5.0))
    torch.testing.assert_close(jmodel(x), model(x))
    assert thunder_core.cache_info(jmodel).entries == 2


def test_the_repeat_call_fast_path_serves_only_the_same_signature():
    """After a call, the next one with tensors of the very same metadata skips building the key;
    any difference (count, shape, strides, dtype, requires_grad, grad mode, a Parameter, a number)
    takes the keyed path and gives eager's result."""

    def fn(*xs):
        out = xs[0] * 2
        for x in xs[1:]:
            out = out + (x.sum() if isinstance(x, torch.Tensor) else x)
        return out

    jfn = thunder_core.jit(fn)
    a = torch.randn(3, 3)
    calls = [
        (a, a),
        (a, a),
        (a,),
        (a, a, a),
        (a, a.t()),
        (a, a.double()),
        (a, a.clone().requires_grad_()),
        (a, torch.nn.Parameter(a.clone())),
        (a, 2.0),
        (a, a),
    ]
    for args in calls:
        torch.testing.assert_close(jfn(*args), fn(*args))
    with torch.no_grad():
        torch.testing.assert_close(jfn(a, a), fn(a, a))
    assert thunder_core.cache_info(jfn).hits >= 2
