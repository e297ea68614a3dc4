"""Every name a model can produce yields valid, unique identifiers in every trace.

Names are generated, not picked: digits first, keywords, soft keywords, unicode, punctuation,
names of generated globals and intermediates (``t0``, ``_inductor_fusion_1``), modules the
trace imports (``torch``, ``prims``), and names that collide once sanitized.
"""

from __future__ import annotations

import ast
import keyword
import random

import pytest
import torch
from torch import nn

import thunder_core

PIECES = [
    *keyword.kwlist[:12], "match", "case", "type", "_", "torch", "prims", "t0", "t12", "_inductor_fusion_1",
    "0", "1", "42", "é", "名前", "ß", "a-b", "a b", "x+y", "__", "___init__", "weight", "bias", "sum", "print",
]  # fmt: skip


def generated_names(seed: int, count: int) -> list[str]:
    """Module names from random concatenations of awkward pieces (``.`` is not allowed by torch)."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))
        if name not in names and not hasattr(nn.Module, name) and name not in ("", "_"):
            names.append(name)
    return names


class Named(nn.Module):
    def __init__(self, names: list[str]):
        super().__init__()
        self.layers = nn.ModuleDict({name: nn.Linear(3, 3) for name in names})
        self.extras = nn.ParameterDict(
            {name: nn.Parameter(torch.randn(3)) for name in names[: len(names) // 2]}
        )

    def forward(self, x):
        out = x
        for layer in self.layers.values():
            out = torch.tanh(layer(out))
        for p in self.extras.values():
            out = out * p
        return out.sum()


def _assert_valid_python(trace):
    source = trace.python()
    ast.parse(source)  # valid Python
    signature = [p.name for p in trace.inputs]
    assert len(set(signature)) == len(signature), "input names are unique"
    for name in signature:
        assert name.isidentifier() and name.isascii() and not keyword.iskeyword(name), name


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("executors", [["torch"], ["inductor", "numba", "torch"]], ids=["torch", "default"])
def test_generated_module_names_train_like_eager(seed, executors):
    torch.manual_seed(seed)
    names = generated_names(seed, 12)
    model = Named(names)
    x = torch.randn(2, 3)
    model(x).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    jm = thunder_core.jit(model, executors=executors)
    loss = jm(x)
    loss.backward()
    torch.testing.assert_close(loss, model(x))
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], msg=n)
    for trace in thunder_core.last_traces(jm):
        _assert_valid_python(trace)


def test_sequential_trains_like_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    reference = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    jm = thunder_core.jit(model)
    opt, ref_opt = (
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.optim.SGD(reference.parameters(), lr=0.1),
    )
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(3):
        for m, o in ((jm, opt), (reference, ref_opt)):
            o.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("seed", range(3))
def test_generated_argument_names(seed):
    rng = random.Random(seed)
    params = []
    while len(params) < 5:
        candidate = rng.choice(["torch", "prims", "t0", "t1", "x", "arg", "arg_", "v", "out", "self_"])
        candidate += rng.choice(["", "_", "1", "_1"])
        if candidate not in params:
            params.append(candidate)
    body = " + ".join(params)
    namespace: dict = {}
    exec(f"def fn({', '.join(params)}):\n    return ({body}) * 2\n", namespace)
    fn = namespace["fn"]
    args = [torch.randn(3, requires_grad=True) for _ in params]
    jf = thunder_core.jit(fn)
    torch.testing.assert_close(jf(*args), fn(*args))
    jf(*args).sum().backward()
    for trace in thunder_core.last_traces(jf):
        _assert_valid_python(trace)
