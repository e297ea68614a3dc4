"""Guard completeness: values the trace was specialized on that earlier walks missed — mutable
containers held as class attributes, sets of mutable objects, state nested deeper than the walk
goes, and signed zeros — are checked before each cached call (or the program runs eagerly with a
warning that says why), so every call gives eager's result."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import thunder_core

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]


@pytest.fixture(params=["torch", "default"])
def executors(request):
    return ["torch"] if request.param == "torch" else DEFAULT_EXECUTORS


class Config:
    scales = {"attention": 1.0, "mlp": 2.0}  # a mutable class attribute, changed in place
    enabled = ["mlp"]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x) * Config.scales["mlp"]
        return y if "mlp" in Config.enabled else x


def test_a_dict_on_a_config_class_mutated_in_place(executors):
    model = Block()
    jmodel = thunder_core.jit(model, executors=executors)
    x = torch.randn(2, 4)
    try:
        torch.testing.assert_close(jmodel(x), model(x))
        Config.scales["mlp"] = -3.0
        torch.testing.assert_close(jmodel(x), model(x))
        Config.enabled.clear()
        torch.testing.assert_close(jmodel(x), model(x))
    finally:
        Config.scales["mlp"], Config.enabled[:] = 2.0, ["mlp"]
    assert any("Config.scales" in r for r in thunder_core.cache_info(jmodel).reasons)


class ModuleWithClassTable(nn.Module):
    table = {"shift": 1.0}

    def forward(self, x):
        return x + self.table["shift"]


def test_a_dict_class_attribute_of_a_module(executors):
    model = ModuleWithClassTable()
    jmodel = thunder_core.jit(model, executors=executors)
    x = torch.zeros(3)
    try:
        for shift in (1.0, 5.0):
            ModuleWithClassTable.table["shift"] = shift
            torch.testing.assert_close(jmodel(x), model(x))
    finally:
        ModuleWithClassTable.table["shift"] = 1.0


class Option:
    def __init__(self, factor):
        self.factor = factor

    def __hash__(self):
        return id(self)


def test_a_set_of_mutable_objects(executors):
    options = {Option(2.0)}

    def fn(x):
        return x * sum(o.factor for o in options)

    jfn = thunder_core.jit(fn, executors=executors)
    x = torch.ones(3)
    torch.testing.assert_close(jfn(x), fn(x))
    next(iter(options)).factor = 7.0  # a member changed in place
    torch.testing.assert_close(jfn(x), fn(x))
    options.add(Option(1.0))  # a member added
    torch.testing.assert_close(jfn(x), fn(x))
    options.pop()
    torch.testing.assert_close(jfn(x), fn(x))


def test_state_nested_deeper_than_the_walk_runs_eagerly_with_a_warning():
    class Node:
        def __init__(self, child):
            self.child = child
            self.value = 1.0

    chain = None
    for _ in range(40):
        chain = Node(chain)

    def fn(x):
        node, total = chain, 0.0
        while node is not None:
            total += node.value
            node = node.child
        return x * total

    jfn = thunder_core.jit(fn)
    x = torch.ones(2)
    with pytest.warns(UserWarning, match="nested more than 32"):
        torch.testing.assert_close(jfn(x), fn(x))
    deepest = chain
    while deepest.child is not None:
        deepest = deepest.child
    deepest.value = 100.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(jfn(x), fn(x))


SIGN = 0.0


def divide_by_signed_zero(x):
    return x / SIGN


def test_negative_zero_and_zero_are_distinct_in_guards(executors):
    global SIGN
    jfn = thunder_core.jit(divide_by_signed_zero, executors=executors)
    x = torch.ones(2)
    try:
        for value in (0.0, -0.0, 0.0, (0.0, -0.0)[1]):
            SIGN = value
            torch.testing.assert_close(jfn(x), divide_by_signed_zero(x))
    finally:
        SIGN = 0.0


def test_negative_zero_and_zero_are_distinct_in_the_cache_key(executors):
    def fn(x, zero: float):
        return x / zero

    jfn = thunder_core.jit(fn, executors=executors)
    x = torch.ones(2)
    for zero in (0.0, -0.0, 0.0, -0.0):
        torch.testing.assert_close(jfn(x, zero), fn(x, zero))
    assert thunder_core.cache_info(jfn).entries == 2


def test_nan_arguments_share_one_entry():
    def fn(x, fill: float):
        return x + fill

    jfn = thunder_core.jit(fn)
    for _ in range(3):
        torch.testing.assert_close(
            jfn(torch.ones(2), float("nan")), torch.full((2,), float("nan")), equal_nan=True
        )
    assert thunder_core.cache_info(jfn).entries == 1


def test_a_tuple_holding_a_negative_zero_is_guarded_by_sign():
    config = {"offsets": (1.0, 0.0)}

    def fn(x):
        return x / config["offsets"][1]

    jfn = thunder_core.jit(fn)
    x = torch.ones(2)
    torch.testing.assert_close(jfn(x), fn(x))
    config["offsets"] = (1.0, -0.0)
    torch.testing.assert_close(jfn(x), fn(x))
