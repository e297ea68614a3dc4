"""Copies of jitted modules: ``copy.deepcopy`` (an EMA of a compiled model) and pickling give an
independent, working jitted module whose results equal eager's; the original keeps working."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import thunder_core

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Dropout(0.0), nn.Linear(12, 3))


@pytest.mark.parametrize("executors", [["torch"], DEFAULT_EXECUTORS], ids=["torch", "default"])
def test_an_ema_copy_of_a_jitted_model(executors):
    model = make_model()
    reference = copy.deepcopy(model)
    jmodel = thunder_core.jit(model, executors=executors)
    x = torch.randn(4, 6)
    jmodel(x).sum().backward()  # compiled and used before the copy
    ema = copy.deepcopy(jmodel)
    ema_reference = copy.deepcopy(reference)
    assert isinstance(ema, thunder_core.ThunderModule) and ema is not jmodel
    assert all(p is not q for p, q in zip(ema.parameters(), jmodel.parameters()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).sum().backward()
    for _ in range(3):
        for opt, m in ((optimizer, jmodel), (reference_optimizer, reference)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), jmodel.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
            for e, p in zip(ema_reference.parameters(), reference.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
        torch.testing.assert_close(ema(x), ema_reference(x))
        torch.testing.assert_close(jmodel(x), reference(x))
    assert thunder_core.cache_info(ema).entries >= 1  # the copy compiles on its own


def test_deepcopy_keeps_train_eval_and_hooks_on_the_jitted_module():
    jmodel = thunder_core.jit(make_model()).eval()
    seen = []
    jmodel.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    clone = copy.deepcopy(jmodel)
    assert not clone.training and not clone._model.training
    clone(torch.randn(2, 6))
    assert seen == [torch.Size([2, 3])]


def test_pickle_round_trip():
    model = make_model()
    jmodel = thunder_core.jit(model, executors=["torch"])
    x = torch.randn(3, 6)
    jmodel(x)
    restored = pickle.loads(pickle.dumps(jmodel))
    assert isinstance(restored, thunder_core.ThunderModule)
    torch.testing.assert_close(restored(x), model(x))
    assert thunder_core.cache_info(restored).entries == 1
    with torch.no_grad():
        next(restored.parameters()).zero_()  # independent of the original
    torch.testing.assert_close(jmodel(x), model(x))


def scale(x):
    return x * 2 + 1


def test_a_jitted_function_copies_and_pickles():
    jfn = thunder_core.jit(scale)
    x = torch.randn(3)
    jfn(x)
    for clone in (copy.deepcopy(jfn), pickle.loads(pickle.dumps(jfn))):
        torch.testing.assert_close(clone(x), scale(x))
        assert thunder_core.cache_info(clone).entries == 1


def test_a_torch_compiled_module_deep_copies():
    torch._dynamo.reset()
    model = make_model()
    compiled = torch.compile(model, backend="thunder_core")
    x = torch.randn(2, 6)
    compiled(x)
    clone = copy.deepcopy(compiled)
    torch.testing.assert_close(clone(x), model(x))
