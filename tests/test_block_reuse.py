"""Capturing a repeated block once: later layers copy its operations when nothing differs.

Each test counts how many times the block's ``forward`` really ran while the model was captured
(a profile function sees every call) and compares results and gradients with eager PyTorch:
a layer that differs in anything its Python could read must run its own Python.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core.testing.models import check_litgpt_training, small_litgpt


class Block(nn.Module):
    def __init__(self, width: int = 16, index: int = 0, scale: float = 1.0, hidden: int = 32):
        super().__init__()
        self.index = index  # set for the layer's own bookkeeping, never read by forward
        self.scale = scale
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x)))) * self.scale


class Stack(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@contextmanager
def counting_calls(*codes):
    """How many times each code object is entered (a profile function, chained by capture)."""
    counts = {code: 0 for code in codes}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in counts:
            counts[frame.f_code] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(previous)


def _first_call_runs(model, x, code=Block.forward.__code__) -> tuple[int, object]:
    """Runs of ``code`` while jit captures ``model`` on its first call, and the jitted model;
    checks the result and the input's gradient against eager."""
    jmodel = thunder_core.jit(model, capture_blocks_once=True)
    x = x.clone().requires_grad_()
    with counting_calls(code) as counts:
        out = jmodel(x)
    expected_x = x.detach().clone().requires_grad_()
    expected = model(expected_x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(x.grad, expected_x.grad)
    return counts[code], jmodel


def test_layers_that_differ_only_in_an_attribute_forward_never_reads_are_captured_once():
    torch.manual_seed(0)
    model = Stack([Block(index=i) for i in range(4)])
    runs, jmodel = _first_call_runs(model, torch.randn(3, 16))
    assert runs == 1
    (block,) = thunder_core.last_blocks(jmodel)
    assert block.calls == 4  # every layer is a call of the one compiled block, on its own parameters


def test_a_layer_whose_config_value_differs_runs_its_own_python():
    torch.manual_seed(0)
    model = Stack([Block(scale=1.0), Block(scale=1.0), Block(scale=2.0), Block(scale=2.0)])
    assert _first_call_runs(model, torch.randn(3, 16))[0] == 2  # one per kind of layer


def test_a_layer_with_a_hook_runs_its_own_python():
    torch.manual_seed(0)
    model = Stack([Block() for _ in range(4)])
    shapes = []
    model.blocks[2].register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    assert _first_call_runs(model, torch.randn(3, 16))[0] == 2  # the first layer, and the hooked one
    assert shapes and set(shapes) == {(3, 16)}


class Casting(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.linear = nn.Linear(8, 8, dtype=dtype)

    def forward(self, x):
        return x + self.linear(x.to(self.linear.weight.dtype)).to(x.dtype)


def test_a_layer_with_parameters_of_another_shape_dtype_or_requires_grad_runs_its_own_python():
    torch.manual_seed(0)
    assert _first_call_runs(Stack([Block(), Block(hidden=24), Block()]), torch.randn(3, 16))[0] == 2
    model = Stack([Casting(), Casting(), Casting(torch.float64), Casting(torch.float64)])
    assert _first_call_runs(model, torch.randn(2, 8), Casting.forward.__code__)[0] == 2
    model = Stack([Block() for _ in range(3)])
    model.blocks[1].up.weight.requires_grad_(False)
    assert _first_call_runs(model, torch.randn(3, 16))[0] == 2  # the third layer is the first one's kind


class Indexed(nn.Module):
    """Reads a per-layer value by a name it computes (as ``getattr(self, f"gain_{...}")`` does)."""

    def __init__(self, gain: float):
        super().__init__()
        self.gain_a = gain
        self.which = "a"
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x) * getattr(self, "gain_" + self.which)


def test_a_layer_reading_attributes_by_computed_names_is_compared_on_every_attribute():
    torch.manual_seed(0)
    model = Stack([Indexed(1.0), Indexed(1.0), Indexed(3.0)])
    assert _first_call_runs(model, torch.randn(2, 8), Indexed.forward.__code__)[0] == 2


class Settings:  # a class used as a namespace of settings
    factor = 1.0


CONFIG = SimpleNamespace(factor=1.0)  # the global the layers read; each test sets what it is


class ReadsAGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x) * CONFIG.factor


class ChangesTheGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(ReadsAGlobal() for _ in range(3))

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            CONFIG.factor = float(i + 1)  # what the next layer reads changes between layers
            x = block(x)
        return x


@pytest.mark.parametrize("holder", [SimpleNamespace(factor=1.0), Settings], ids=["object", "class"])
def test_a_global_the_layer_reads_that_changes_between_layers_makes_them_differ(holder, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CONFIG", holder)
    torch.manual_seed(0)
    model = ChangesTheGlobal()
    x = torch.randn(2, 8, requires_grad=True)
    jmodel = thunder_core.jit(model, capture_blocks_once=True)
    with counting_calls(ReadsAGlobal.forward.__code__) as counts:
        out = jmodel(x)
    torch.testing.assert_close(out, model(x))
    assert counts[ReadsAGlobal.forward.__code__] == 3


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, scale: float):
        return self.linear(x) * scale


class PassesNumbers(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Scaled() for _ in range(4))

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x, 1.0 if i < 2 else 0.5)
        return x


def test_arguments_are_compared_by_value():
    torch.manual_seed(0)
    assert _first_call_runs(PassesNumbers(), torch.randn(2, 8), Scaled.forward.__code__)[0] == 2


class Counting(nn.Module):
    """Changes its own state on every call: each layer must run its Python."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


def test_a_layer_that_changes_its_own_state_is_not_reused():
    torch.manual_seed(0)
    model = Stack([Counting() for _ in range(3)])
    jmodel = thunder_core.jit(model, capture_blocks_once=True)
    with counting_calls(Counting.forward.__code__) as counts:
        jmodel(torch.randn(2, 8))
    assert counts[Counting.forward.__code__] == 3
    assert [block.calls for block in model.blocks] == [1, 1, 1]


@pytest.mark.parametrize("dynamic", [False, True])
def test_changing_sizes_with_reused_layers_give_eagers_results(dynamic):
    torch.manual_seed(0)
    model = Stack([Block(index=i) for i in range(3)])
    jmodel = thunder_core.jit(model, dynamic=dynamic, capture_blocks_once=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 16)
        torch.testing.assert_close(jmodel(x), model(x))


def test_litgpt_training_with_layers_captured_once_matches_eager():
    model = small_litgpt(n_layer=3)
    code = type(model.transformer.h[0]).forward.__code__
    jmodel = thunder_core.jit(model, capture_blocks_once=True)
    x = torch.randint(0, 128, (2, 16))
    with counting_calls(code) as counts:
        jmodel(x)
    assert counts[code] == 1  # block_idx is set in __init__ and not read by the forward
    check_litgpt_training(["torch"], capture_blocks_once=True)  # loss and every gradient as eager's


class Normalized(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.norm(self.linear(x)))


def test_in_place_updates_are_copied_onto_each_layers_own_buffers():
    """BatchNorm's running statistics (updated in place in training) end as eager leaves them."""
    import copy

    torch.manual_seed(0)
    model = Stack([Normalized() for _ in range(3)]).train()
    reference = copy.deepcopy(model)
    x = torch.randn(6, 8, requires_grad=True)  # as every later layer's input
    jmodel = thunder_core.jit(model, capture_blocks_once=True)
    with counting_calls(Normalized.forward.__code__) as counts:
        out = jmodel(x)
    torch.testing.assert_close(out, reference(x))
    assert counts[Normalized.forward.__code__] == 1
    for got, want in zip(model.blocks, reference.blocks):
        torch.testing.assert_close(got.norm.running_mean, want.norm.running_mean)
        torch.testing.assert_close(got.norm.running_var, want.norm.running_var)
        assert int(got.norm.num_batches_tracked) == int(want.norm.num_batches_tracked) == 1


LOG: list = []


class Logging(nn.Module):
    """Appends to a global list it reads: each layer's call must append for itself."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        LOG.append(len(LOG))
        return self.linear(x)


def test_a_layer_that_changes_a_global_it_reads_is_not_reused():
    torch.manual_seed(0)
    LOG.clear()
    jmodel = thunder_core.jit(Stack([Logging() for _ in range(3)]), capture_blocks_once=True)
    with counting_calls(Logging.forward.__code__) as counts:
        jmodel(torch.randn(2, 8))
    assert counts[Logging.forward.__code__] == 3 and LOG == [0, 1, 2]


def test_without_the_option_every_layer_runs_its_python():
    torch.manual_seed(0)
    jmodel = thunder_core.jit(Stack([Block(index=i) for i in range(4)]))
    with counting_calls(Block.forward.__code__) as counts:
        jmodel(torch.randn(3, 16, requires_grad=True))
    assert counts[Block.forward.__code__] == 4


def _same_as_eager(model, *args):
    got = thunder_core.jit(model, capture_blocks_once=True)(*args)
    want = model(*args)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(a, b)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, h, skip):
        return self.a(h) + self.b(skip)


class SkipFromTheInput(Stack):
    def forward(self, x):
        h = x
        for block in self.blocks:  # the first layer gets (x, x), later ones (h, x)
            h = block(h, x)
        return h


def test_a_layer_given_the_same_tensor_twice_is_not_the_template_of_one_given_two():
    torch.manual_seed(0)
    _same_as_eager(SkipFromTheInput([TwoInputs() for _ in range(3)]), torch.randn(2, 8, requires_grad=True))


class WritesItsCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, cache: dict):
        y = self.linear(x)
        cache["k"] = y
        return y


class WithCaches(Stack):
    def forward(self, x):
        caches = [{"k": x} for _ in self.blocks]
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache)
        return [cache["k"] for cache in caches]


def test_a_layer_that_writes_into_an_argument_is_not_reused():
    torch.manual_seed(0)
    _same_as_eager(WithCaches([WritesItsCache() for _ in range(3)]), torch.randn(2, 8, requires_grad=True))


STEP = torch.zeros(())


class CountsSteps(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        STEP.add_(1)  # a tensor every layer shares, updated in place
        return self.linear(x) * STEP


def test_an_in_place_update_of_a_tensor_every_layer_shares_is_copied_in_order():
    torch.manual_seed(0)
    model = Stack([CountsSteps() for _ in range(3)])
    x = torch.randn(2, 8, requires_grad=True)
    STEP.zero_()
    got = thunder_core.jit(model, capture_blocks_once=True)(x)
    STEP.zero_()
    torch.testing.assert_close(got, model(x))


def test_a_global_module_hook_turns_reuse_off():
    torch.manual_seed(0)
    model = Stack([Block() for _ in range(3)])
    scaled = {id(model.blocks[2].down)}
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: out * 10 if id(module) in scaled else None
    )
    try:
        runs, _ = _first_call_runs(model, torch.randn(3, 16))
    finally:
        handle.remove()
    assert runs == 3
