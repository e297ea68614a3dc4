"""Guards skip the checks of dicts that were not written to (PEP 509 versions, CPython < 3.12):
every kind of state such a check covers, changed after the versions were recorded (the second
call records them, the third takes the short path), is still seen before the next call."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core.jit import dict_versions, guards

SETTINGS = types.SimpleNamespace(scale=2.0, table={"shift": 1.0}, order=["a", "b"])
OFFSET = 1.0


class Settings:
    def __init__(self):
        self.bias = 0.5


class Net(nn.Module):
    sign = 1.0

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = 1.5
        self.settings = Settings()

    def forward(self, x):
        y = self.fc(x) * self.scale * self.sign + self.settings.bias + OFFSET
        y = y * SETTINGS.scale + SETTINGS.table["shift"]
        return y if SETTINGS.order[0] == "a" else -y


def _change_attribute(net):
    net.scale = -4.0


def _change_class_attribute(net):
    Net.sign = -1.0


def _replace_submodule(net):
    net.fc = nn.Linear(4, 4)


def _add_forward_hook(net):
    net.fc.register_forward_hook(lambda module, args, out: out * 10)


def _add_forward_hook_with_kwargs(net):
    net.fc.register_forward_hook(lambda module, args, kwargs, out: out * 10, with_kwargs=True)


def _add_forward_hook_always_called(net):
    net.fc.register_forward_hook(lambda module, args, out: out - 3, always_call=True)


def _add_forward_pre_hook_with_kwargs(net):
    net.fc.register_forward_pre_hook(lambda module, args, kwargs: ((args[0] * 2,), kwargs), with_kwargs=True)


def _add_global_hook(net):
    return nn.modules.module.register_module_forward_hook(lambda module, args, out: out + 1)


def _change_plain_object(net):
    net.settings.bias = 7.0


def _change_global(net):
    global OFFSET
    OFFSET = -2.0


def _change_global_namespace(net):
    SETTINGS.scale = 3.0


def _change_nested_dict(net):
    SETTINGS.table["shift"] = 9.0


def _change_list_in_place(net):
    SETTINGS.order.reverse()


CHANGES = [
    _change_attribute,
    _change_class_attribute,
    _replace_submodule,
    _add_forward_hook,
    _add_forward_hook_with_kwargs,
    _add_forward_hook_always_called,
    _add_forward_pre_hook_with_kwargs,
    _add_global_hook,
    _change_plain_object,
    _change_global,
    _change_global_namespace,
    _change_nested_dict,
    _change_list_in_place,
]


@pytest.fixture(autouse=True)
def _restore_state():
    global OFFSET
    yield
    OFFSET = 1.0
    Net.sign = 1.0
    SETTINGS.scale, SETTINGS.table, SETTINGS.order = 2.0, {"shift": 1.0}, ["a", "b"]


@pytest.mark.parametrize("calls", [3, 3 + dict_versions.NATIVE_AFTER_CALLS], ids=["python", "native"])
@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.removeprefix("_"))
def test_a_change_after_the_versions_were_recorded_is_seen(change, calls):
    """``native``: enough calls in a row that PyTorch's C++ guard manager checks the versions."""
    if calls > 3:
        pytest.importorskip("torch._dynamo")  # its guard managers need it imported
    net = Net()
    jnet = thunder_core.jit(net, executors=["torch"])
    x = torch.randn(3, 4)
    for _ in range(calls):  # compile; record the versions; the short path
        torch.testing.assert_close(jnet(x), net(x))
    handle = change(net)
    try:
        torch.testing.assert_close(jnet(x), net(x))
        torch.testing.assert_close(jnet(x), net(x))
    finally:
        if handle is not None:
            handle.remove()
    info = thunder_core.cache_info(jnet)
    # A submodule replaced by one of the same class keeps the entry (its parameters are inputs).
    assert info.entries == (1 if change is _replace_submodule else 2), info.reasons


def test_an_equal_value_written_again_keeps_the_entry():
    net = Net()
    jnet = thunder_core.jit(net, executors=["torch"])
    x = torch.randn(3, 4)
    for _ in range(3):
        jnet(x)
    net.scale = float("1.5")  # another object, the same value: the full check runs and holds
    net.settings.bias = 0.25 + 0.25
    torch.testing.assert_close(jnet(x), net(x))
    torch.testing.assert_close(jnet(x), net(x))
    assert thunder_core.cache_info(jnet).entries == 1


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="dict versions (PEP 509) are read before CPython 3.12"
)
def test_the_short_path_runs_only_the_checks_no_version_covers():
    builder = guards.GuardBuilder()
    net = Net()
    builder.contents(net, "net")
    guard = builder.build()
    assert guard.check() is None  # the full check, which records the versions
    assert "_full_check" in guard.source
    short = guard.source.split("def check():")[1]
    assert short.count("if not") < len(guard) // 4  # most checks read an unchanged dict
    net.scale = 3.0
    index, value = guard.check()
    assert value == 3.0 and "net.scale" in guard.describe((index, value))


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="dict versions (PEP 509) are read before CPython 3.12"
)
def test_pytorchs_guard_manager_takes_over_the_versions_after_calls_in_a_row_and_sees_a_write():
    pytest.importorskip("torch._dynamo")
    builder = guards.GuardBuilder()
    net = Net()
    builder.contents(net, "net")
    guard = builder.build()
    assert guard.check() is None  # the full check, which records the versions
    python_hold = guard._namespace["_hold"]
    for _ in range(dict_versions.NATIVE_AFTER_CALLS):
        assert guard.check() is None
    native = guard._namespace["_hold"]
    assert native is not python_hold and native() is True
    net.settings.bias = 3.0
    assert native() is False
    index, value = guard.check()
    assert value == 3.0 and "bias" in guard.describe((index, value))
    net.settings.bias = 0.5
    assert guard.check() is None and guard._namespace["_hold"] is python_hold  # read from Python again
