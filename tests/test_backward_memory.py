"""The generated backward frees each tensor the forward saved right after its last use, as
PyTorch's autograd does op by op, instead of holding all of them until the backward returns."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_core


class _AliveAtEachOp(TorchDispatchMode):
    """Counts, at every operation the backward runs, how many saved tensors are still alive."""

    def __init__(self, saved: list[weakref.ref]):
        super().__init__()
        self.saved = saved
        self.alive: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.alive.append(sum(ref() is not None for ref in self.saved))
        return func(*args, **(kwargs or {}))


def _chain(x):
    for _ in range(8):
        x = torch.sin(x) * 2  # sin's backward reads its input: one saved tensor per stage
    return x


def _saved_alive_during_backward(fn, *, retain_graph: bool = False) -> list[int]:
    x = torch.randn(64, 64, requires_grad=True)
    saved: list[weakref.ref] = []

    def pack(tensor):
        saved.append(weakref.ref(tensor))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        y = fn(x)
    counter = _AliveAtEachOp(saved)
    with counter:
        y.sum().backward(retain_graph=retain_graph)
    return counter.alive


def test_saved_tensors_are_freed_as_the_backward_goes_like_eager():
    eager = _saved_alive_during_backward(_chain)
    jitted = _saved_alive_during_backward(thunder_core.jit(_chain, executors=["torch"]))
    assert eager[0] == jitted[0] == 8  # every stage saved one tensor
    # Eager frees them one stage at a time; so must the generated backward (it held all 8 to the end).
    assert eager[-1] == 1 and jitted[-1] == 1
    assert sorted(set(jitted), reverse=True) == list(range(8, 0, -1))


def test_retain_graph_keeps_what_a_second_backward_reads():
    x = torch.randn(16, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)

    def f(x, w):
        return (torch.tanh(x @ w) * x.sin()).sum(-1)

    grads = []
    for fn in (f, thunder_core.jit(f)):
        x.grad = w.grad = None
        y = fn(x, w)
        y.sum().backward(retain_graph=True)
        first = (x.grad.clone(), w.grad.clone())
        (y * 2).sum().backward()
        grads.append((*first, x.grad, w.grad))
    for eager, jitted in zip(*grads):
        torch.testing.assert_close(jitted, eager)
    alive = _saved_alive_during_backward(thunder_core.jit(_chain, executors=["torch"]), retain_graph=True)
    assert alive[-1] == 8  # retained: nothing the graph saved was dropped


def test_the_printed_backward_takes_and_empties_one_list():
    fn = thunder_core.jit(_chain)
    fn(torch.randn(4, requires_grad=True)).sum().backward()
    source = str(thunder_core.last_backward_traces(fn)[-1])
    assert "def backward(inputs):" in source and "inputs.clear()" in source
