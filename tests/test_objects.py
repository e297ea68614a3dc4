"""Python objects as arguments and results: flattened into tensors plus a keyed structure, and
what the function does to them done to the caller's objects after every call, as eager does.
Each case runs eagerly on a copy of the arguments and compares the objects eager leaves."""

from __future__ import annotations

import collections
import copy
import functools
import re
import sys
import time
from dataclasses import dataclass, field

import pytest
import torch
from models import greedy_generate, hf_llama, token_batch
from torch import nn

import thunder_core
from thunder_core import CaptureError


@dataclass
class State:
    hidden: torch.Tensor
    scale: float = 2.0
    history: list = field(default_factory=list)
    steps: int = 0
    ready: bool = False


def step(x, state: State):
    out = (x @ state.hidden).tanh() * state.scale
    state.hidden = state.hidden + out.mean()  # an attribute set to a computed tensor
    state.history.append(out.sum())  # a list appended to
    state.steps = state.steps + 1  # a Python value changed
    state.ready = True
    return out


def _same_state(a: State, b: State) -> None:
    torch.testing.assert_close(a.hidden, b.hidden)
    assert (a.scale, a.steps, a.ready, len(a.history)) == (b.scale, b.steps, b.ready, len(b.history))
    for got, want in zip(a.history, b.history):
        torch.testing.assert_close(got, want)


def test_a_dataclass_argument_is_changed_as_eager_changes_it_on_every_call():
    jfn = thunder_core.jit(step)
    x = torch.randn(3, 4)
    mine, reference = State(torch.randn(4, 4)), None
    reference = copy.deepcopy(mine)
    for _ in range(4):
        torch.testing.assert_close(jfn(x, mine), step(x, reference))
        _same_state(mine, reference)
    info = thunder_core.cache_info(jfn)
    # steps and the history's length are in the key: each new value compiles, as a Python value does
    assert info.entries == 4 and info.hits == 0
    fresh, fresh_reference = State(torch.randn(4, 4)), None
    fresh_reference = copy.deepcopy(fresh)
    torch.testing.assert_close(jfn(x, fresh), step(x, fresh_reference))  # another object, same structure
    _same_state(fresh, fresh_reference)
    assert thunder_core.cache_info(jfn).hits == 1


def test_an_object_whose_tensors_change_hits_the_cache_and_is_updated():
    @dataclass
    class Cache:
        keys: torch.Tensor
        seen: torch.Tensor

    def attend(q, cache: Cache):
        cache.keys = torch.cat([cache.keys[1:], q])  # a new tensor in the attribute, same shape
        cache.seen.add_(1)  # a tensor updated in place
        return (q @ cache.keys.T).softmax(-1)

    jfn = thunder_core.jit(attend)
    mine = Cache(torch.randn(5, 8), torch.zeros(()))
    reference = copy.deepcopy(mine)
    for i in range(5):
        q = torch.randn(1, 8)
        torch.testing.assert_close(jfn(q, mine), attend(q, reference))
        torch.testing.assert_close(mine.keys, reference.keys)
        assert mine.seen.item() == reference.seen.item() == i + 1
    assert thunder_core.cache_info(jfn).entries == 1


def test_lists_and_dicts_given_are_changed_in_place():
    def fn(x, outputs: list, stats: dict):
        y = x.exp()
        outputs.append(y)
        stats["max"] = y.max()
        stats.pop("stale")
        return y.sum()

    jfn = thunder_core.jit(fn)
    x = torch.randn(4)
    mine, stats = [], {"stale": 1}
    result = jfn(x, mine, stats)
    torch.testing.assert_close(result, x.exp().sum())
    assert len(mine) == 1 and set(stats) == {"max"}
    torch.testing.assert_close(mine[0], x.exp())
    torch.testing.assert_close(stats["max"], x.exp().max())


def test_one_object_given_twice_is_one_object():
    def fn(state: State, same: State, items: list, again: list):
        state.hidden = state.hidden + 1
        items.append(items[0] * 2)
        return same.hidden * 2, len(again)

    jfn = thunder_core.jit(fn)
    for _ in range(2):
        mine, items = State(torch.zeros(3)), [torch.ones(2)]
        ref, ref_items = copy.deepcopy(mine), [torch.ones(2)]
        got, want = jfn(mine, mine, items, items), fn(ref, ref, ref_items, ref_items)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(mine.hidden, ref.hidden)
        assert len(items) == len(ref_items) == 2


def test_the_argument_object_returned_is_the_callers_own():
    def fn(x, state: State):
        state.hidden = state.hidden * x
        return {"out": state.hidden.sum(), "state": state}

    jfn = thunder_core.jit(fn)
    for _ in range(2):
        state = State(torch.randn(3))
        expected = state.hidden * 2.0
        result = jfn(torch.tensor(2.0), state)
        assert result["state"] is state
        torch.testing.assert_close(state.hidden, expected)


class Pair:
    """A plain object a function creates (not a dataclass, not a pytree node)."""

    def __init__(self, first, second):
        self.first, self.second, self.label = first, second, "pair"


def test_an_object_the_function_creates_is_made_again_on_every_call():
    def fn(x):
        pair = Pair(x.sin(), [x * 2, x + 1])
        return {"pair": pair, "total": pair.first.sum()}

    jfn = thunder_core.jit(fn)
    results = []
    for _ in range(2):
        x = torch.randn(3)
        got, want = jfn(x), fn(x)
        assert type(got["pair"]) is Pair and got["pair"].label == "pair"
        torch.testing.assert_close(got["pair"].first, want["pair"].first)
        torch.testing.assert_close(got["pair"].second, want["pair"].second)
        torch.testing.assert_close(got["total"], want["total"])
        results.append(got["pair"])
    assert results[0] is not results[1] and results[0].second is not results[1].second
    assert thunder_core.cache_info(jfn).entries == 1


def test_an_object_the_function_creates_and_returns_twice_is_one_object():
    def fn(x):
        pair = Pair(x * 2, [])
        return pair, [pair], {"again": pair}

    got = thunder_core.jit(fn)(torch.randn(3))
    assert got[0] is got[1][0] is got[2]["again"]


def test_a_created_object_holding_an_object_without_tensors_is_refused():
    """The inner object may be new on every call (eager) or one that existed before: thunder_core
    cannot tell which, so it refuses instead of sharing one object across calls."""

    class Notes:
        def __init__(self):
            self.items = []

    def fn(x):
        pair = Pair(x.sin(), None)
        pair.notes = Notes()
        return pair

    with pytest.raises(CaptureError, match="cannot tell whether the function made it"):
        thunder_core.jit(fn)(torch.randn(3))


def test_a_created_object_of_a_class_that_needs_arguments_to_be_made_is_refused():
    class Strict:
        def __new__(cls, value):
            return super().__new__(cls)

        def __init__(self, value):
            self.value = value

    with pytest.raises(CaptureError, match="cannot make again"):
        thunder_core.jit(lambda x: Strict(x * 2))(torch.randn(3))


def test_a_created_object_stored_on_the_module_is_refused():
    class Keeps(nn.Module):
        def forward(self, x):
            self.kept = Pair(x.relu(), None)  # Python state the trace cannot set on later calls
            return self.kept

    with pytest.raises(CaptureError, match="stored a tensor it computed into"):
        thunder_core.jit(Keeps())(torch.randn(3))


def test_a_hugging_face_forward_returns_its_new_cache_and_takes_it_back():
    """A Hugging Face causal LM called without a cache (``use_cache`` on, the default) returns a new
    ``DynamicCache``; passing it back in runs the next step on it, as in eager."""
    model = hf_llama()
    model.config.use_cache = True
    model.eval()
    jitted = thunder_core.jit(model)
    prompt, token = token_batch(1, 7), token_batch(1, 1, seed=1)
    with torch.no_grad():
        want = model(prompt)
        got = jitted(prompt)
        assert type(got.past_key_values) is type(want.past_key_values)
        torch.testing.assert_close(got.logits, want.logits)
        for mine, theirs in zip(got.past_key_values.layers, want.past_key_values.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys)
            torch.testing.assert_close(mine.values, theirs.values)
        assert jitted(prompt).past_key_values is not got.past_key_values  # a new one on every call
        want_next = model(token, past_key_values=want.past_key_values)
        got_next = jitted(token, past_key_values=got.past_key_values)
    torch.testing.assert_close(got_next.logits, want_next.logits)
    assert got_next.past_key_values is got.past_key_values
    assert got.past_key_values.get_seq_length() == want.past_key_values.get_seq_length() == 8


def test_a_change_to_a_container_that_cannot_be_replayed_is_refused():
    class Log(list):
        pass

    def fn(x, log: Log):
        log.append(x.sum())
        return x * 2

    with pytest.raises(CaptureError, match="changes its argument log"):
        thunder_core.jit(fn)(torch.randn(3), Log())


def test_a_bound_method_is_cached_like_the_module():
    class Scaler(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x).relu()

    model = Scaler()
    model.forward = thunder_core.jit(model.forward)
    x = torch.randn(2, 4)
    torch.testing.assert_close(model(x), model.linear(x).relu())
    with torch.no_grad():
        model.linear.weight.mul_(-1)  # parameters are read on every call
    torch.testing.assert_close(model(x), model.linear(x).relu())
    model.linear.weight = nn.Parameter(torch.randn(4, 4))  # a new parameter: an input, not a recompile
    torch.testing.assert_close(model(x), model.linear(x).relu())
    info = thunder_core.cache_info(model.forward)
    assert info.entries == 1 and info.hits == 2
    copied = copy.deepcopy(model)  # the copy's forward is compiled for the copy
    with torch.no_grad():
        copied.linear.weight.zero_()
    torch.testing.assert_close(copied(x), copied.linear.bias.relu().expand(2, 4))
    torch.testing.assert_close(model(x), model.linear(x).relu())


def test_a_wrapper_around_the_jitted_forward_with_state_of_its_own_does_not_recompile():
    """``model.forward = timed(thunder_core.jit(model.forward))``: the wrapper, in the method's own
    place, is how the program is called, so its changing state (a call counter) is not guarded."""

    class Scaler(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.scale = 2.0

        def forward(self, x):
            return self.linear(x) * self.scale

    def counted(fn):
        calls = 0

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            nonlocal calls
            calls += 1
            return fn(*args, **kwargs)

        return wrapper

    def timed(fn, *args, times: list, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return out

    wrappers = (
        counted,
        lambda jitted: functools.partial(timed, jitted, times=[]),
        lambda jitted: counted(counted(jitted)),  # the outer one reaches the program by __wrapped__
    )
    for wrap in wrappers:
        model = Scaler()
        jitted = thunder_core.jit(model.forward)
        model.forward = wrap(jitted)
        x = torch.randn(2, 4)
        for _ in range(4):
            torch.testing.assert_close(model(x), model.linear(x) * 2.0)
        model.scale = 3.0  # the module's own state is still guarded
        torch.testing.assert_close(model(x), model.linear(x) * 3.0)
        info = thunder_core.cache_info(jitted)
        assert info.entries == 2 and info.hits == 3, info.reasons
        assert "scale" in info.reasons[1], info.reasons


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hugging_face_generate_with_the_forward_jitted_gives_eagers_tokens(cache, dynamic):
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).eval()
    kwargs = {} if cache == "dynamic" else {"cache_implementation": "static"}
    prompts = [token_batch(1, 9, seed=1), token_batch(1, 5, seed=2)]
    expected = [greedy_generate(model, p, **kwargs) for p in prompts]
    model.forward = thunder_core.jit(model.forward, dynamic=dynamic)
    entries = []
    for prompt, want in zip(prompts, expected):
        assert torch.equal(greedy_generate(model, prompt, **kwargs), want)
        entries.append(thunder_core.cache_info(model.forward).entries)
    info = thunder_core.cache_info(model.forward)
    assert info.hits + info.misses == 2 * 6  # a forward call per token
    assert entries[0] <= 3 and entries[1] - entries[0] <= 2, info.reasons  # not a compile per token
    if dynamic:  # the prefill and the decoding steps; the cache a prefill leaves is laid out as eager's
        assert entries == [2, 2], info.reasons
    assert any("symbolic sizes" in reason for reason in info.reasons), info.reasons
    inputs = [p.name for p in thunder_core.last_traces(model.forward)[0].inputs]
    assert any(name.startswith("past_key_values_layers_1_keys") for name in inputs), (
        inputs
    )  # the cache's tensors


def test_hugging_face_generate_of_a_model_that_builds_its_mask_with_torch_vmap_gives_eagers_tokens():
    """Falcon passes a mask function of its own, so Hugging Face builds the attention mask with
    ``torch.vmap`` inside the forward: recorded as thunder_core.vmap, not refused."""
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    config = FalconConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          max_position_embeddings=128)  # fmt: skip
    model = FalconForCausalLM(config).eval()
    prompts = [token_batch(1, 9, seed=1), token_batch(1, 5, seed=2)]
    expected = [greedy_generate(model, p) for p in prompts]
    model.forward = thunder_core.jit(model.forward)
    for prompt, want in zip(prompts, expected):
        assert torch.equal(greedy_generate(model, prompt), want)
    assert thunder_core.cache_info(model.forward).entries <= 5
    assert torch.vmap is torch.func.vmap is torch._functorch.apis.vmap  # torch's own, back in place


def test_a_static_caches_writes_run_inside_inductor_regions():
    """StaticCache writes each new key and value with index_copy_: Inductor's maximal regions take
    the writes, the cache keeps its tensors, and the tokens are eager's on every generate."""
    pytest.importorskip("thunder_executor_inductor")
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).eval()
    prompts = [token_batch(1, 6, seed=5), token_batch(1, 9, seed=6)]
    kwargs = {"cache_implementation": "static"}
    expected = [greedy_generate(model, p, **kwargs) for p in prompts]
    model.forward = thunder_core.jit(
        model.forward, dynamic=True, executors=["inductor"], options={"inductor": {"regions": "maximal"}}
    )
    for prompt, want in [*zip(prompts, expected), (prompts[0], expected[0])]:
        assert torch.equal(greedy_generate(model, prompt, **kwargs), want)
    trace = thunder_core.last_traces(model.forward)[-1]
    in_regions = [
        s.symbol.name
        for b in trace.bound_symbols
        if b.executor == "inductor"
        for s in b.subsymbols
        if s.symbol.name.endswith("index_copy_")
    ]
    assert len(in_regions) == 2 * 2, trace  # keys and values of both layers
    assert not [b for b in trace.bound_symbols if b.symbol.name.endswith("index_copy_")]  # none left to torch


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hugging_face_generate_through_the_torch_compile_front_end(cache, dynamic):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).eval()
    kwargs = {} if cache == "dynamic" else {"cache_implementation": "static"}
    prompt = token_batch(1, 7, seed=3)
    expected = greedy_generate(model, prompt, **kwargs)
    another = token_batch(1, 11, seed=4)
    expected_another = greedy_generate(model, another, **kwargs)
    model.forward = torch.compile(model.forward, backend="thunder_core", dynamic=dynamic)
    assert torch.equal(greedy_generate(model, prompt, **kwargs), expected)
    from thunder_core.inspection import compile_report

    def compiles():
        return [
            thunder_core.cache_info(p).entries for _, _, p in compile_report(model.forward).thunder_parts()
        ]

    before = compiles()
    assert torch.equal(
        greedy_generate(model, another, **kwargs), expected_another
    )  # a prompt of another length
    report = str(thunder_core.explain(model.forward))
    if dynamic:  # Dynamo's float attributes read as numbers (no split at .item()), sizes symbolic at once
        assert not re.search(r"\.item\b", report), report
        assert compiles() == before, (before, compiles())  # the new length compiled nothing
    assert "-> thunder_core" in report and "[graph 0 submod_" in report, report
    if cache == "dynamic":  # a StaticCache is written by index_copy_, which Inductor runs
        assert "-> inductor" not in report, report  # every graph is thunder_core's
    assert max(compiles()) <= 2, compiles()  # no compile per generated token
    torch._dynamo.reset()


def test_an_object_keeping_state_in_slots_is_refused():
    class Base:
        __slots__ = ("scale",)  # not in vars(): the key could not see it change

    class Mixed(Base):
        pass

    mixed = Mixed()
    mixed.scale, mixed.t = 2.0, torch.ones(2)
    with pytest.raises(TypeError, match="argument 'o' has type .*Mixed"):
        thunder_core.jit(lambda o: o.t * o.scale)(mixed)


def test_training_with_an_object_that_keeps_results_of_earlier_steps():
    # The list keeps each step's loss, which needs a gradient and whose graph is freed after its
    # backward: the next steps store it again untouched and never differentiate through it.
    @dataclass
    class Run:
        scale: torch.Tensor
        losses: list

    def loss_of(w, run: Run):
        loss = (w * run.scale).tanh().sum()
        run.scale = run.scale * 0.5
        run.losses.append(loss)
        return loss

    w = torch.randn(3, requires_grad=True)
    mine, reference = Run(torch.ones(3), []), Run(torch.ones(3), [])
    jfn = thunder_core.jit(loss_of)
    for _ in range(3):
        w.grad = None
        jfn(w, mine).backward()
        got = w.grad
        w.grad = None
        loss_of(w, reference).backward()
        torch.testing.assert_close(got, w.grad)
        torch.testing.assert_close(mine.scale, reference.scale)
    first = mine.losses[0]
    assert len(mine.losses) == 3 and mine.losses[0] is first
    torch.testing.assert_close(torch.stack(mine.losses), torch.stack(reference.losses))


def test_an_argument_that_requires_grad_but_is_unused_is_not_differentiated_through():
    w = torch.randn(3, requires_grad=True)
    stale = (w * 3).sum()
    stale.backward()  # its graph is freed: eager never walks into it again
    jfn = thunder_core.jit(lambda x, unused: (x * 2).sum())
    w.grad = None
    jfn(w, stale).backward()
    torch.testing.assert_close(w.grad, torch.full((3,), 2.0))


def _sine(x):
    return x.sin() * 2


def _cosine(x):
    return x.cos() + 1


def _store_result(x):
    global STORED_RESULT
    STORED_RESULT = x.exp()
    return STORED_RESULT


def test_a_trace_kept_in_a_global_does_not_stop_a_capture_but_a_stored_result_does(monkeypatch):
    """A notebook keeps ``trace = thunder_core.last_traces(f)[-1]`` in a global, then jits another
    function of the same module: the old trace's proxies were there before the capture and are
    not something it stored. A function that stores a tensor it computes in a global is still
    refused."""
    jsin = thunder_core.jit(_sine)
    jsin(torch.randn(3))
    trace = thunder_core.last_traces(jsin)[-1]
    monkeypatch.setitem(globals(), "KEPT_TRACE", [trace, trace.output])
    monkeypatch.setitem(globals(), "STORED_RESULT", None)
    x = torch.randn(3)
    torch.testing.assert_close(thunder_core.jit(_cosine)(x), _cosine(x))
    with pytest.raises(CaptureError, match="stored a tensor it computed into"):
        thunder_core.jit(_store_result)(x)


def test_a_tensor_appended_to_a_list_the_module_holds_is_refused():
    class Keeps(nn.Module):
        def __init__(self):
            super().__init__()
            self.kept = []

        def forward(self, x):
            self.kept.append(x.relu())  # a traced tensor left in Python state
            return x * 2

    with pytest.raises(CaptureError, match="stored a tensor it computed into model.kept"):
        thunder_core.jit(Keeps())(torch.randn(3))


SIZES_SEEN: list = []


class _Recorder:
    pass


_Point = collections.namedtuple("_Point", "rows columns")


RECORDER = _Recorder()


class _LogsSizes(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.log, self.last = [], {}

    def forward(self, x):
        self.log.append(x.shape[0])
        self.last["shape"] = (x.shape[0], x.shape[1] * 2)
        SIZES_SEEN.append(x.shape[0] * 2)
        RECORDER.rows = x.shape[0]
        RECORDER.point = _Point(x.shape[0], x.shape[1])
        return self.linear(x) * x.shape[0]


@pytest.mark.parametrize("dynamic", [None, True])
def test_sizes_a_function_stores_in_python_state_are_eagers_ints(dynamic, monkeypatch):
    """A size the function appends to a list, stores in a dict or on an object, or in a global,
    is the int eager leaves there, not a symbolic size of the compiled program."""
    monkeypatch.setattr(sys.modules[__name__], "SIZES_SEEN", [])
    model, reference = _LogsSizes(), _LogsSizes()
    reference.load_state_dict(model.state_dict())
    jitted = thunder_core.jit(model, dynamic=dynamic)
    seen_by_eager = []
    for n in (4, 4, 5, 7, 7, 4):
        x = torch.randn(n, 3)
        torch.testing.assert_close(jitted(x), reference(x))
        seen_by_eager += [n * 2, n * 2]  # the compiled call's, then eager's
        assert RECORDER.rows == n and type(RECORDER.rows) is int
        assert (
            RECORDER.point == (n, 3) and type(RECORDER.point) is _Point and type(RECORDER.point.rows) is int
        )
    assert model.log == reference.log and all(type(v) is int for v in model.log)
    assert model.last == reference.last and all(type(v) is int for v in model.last["shape"])
    assert SIZES_SEEN == seen_by_eager and all(type(v) is int for v in SIZES_SEEN)


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_returned_shape_is_a_torch_size(dynamic):
    def scaled_with_shape(x):
        return x * 2, {"shape": x.shape, "rows": [x.shape[0]]}, x.shape[1:]

    jitted = thunder_core.jit(scaled_with_shape, dynamic=dynamic)
    for n in (4, 6):
        x = torch.randn(n, 5)
        out, info, tail = jitted(x)
        _, want_info, want_tail = scaled_with_shape(x)
        assert type(info["shape"]) is torch.Size and info["shape"] == want_info["shape"]
        assert type(tail) is torch.Size and tail == want_tail and info["shape"].numel() == n * 5
        assert info["rows"] == [n]
