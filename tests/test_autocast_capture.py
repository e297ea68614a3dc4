"""torch.autocast as the captured code sees it: around the call and in blocks inside the function.

Capture records the casts autocast makes as they happen, so code that inspects dtypes (or asks
whether autocast is on) takes eager's branch, and a block that turns autocast on or off inside
the function is honoured; the program holds every cast and runs with autocast off.
"""

from __future__ import annotations

import pytest
import torch

import thunder_core

FRONT_ENDS = {
    "jit": thunder_core.jit,
    "torch.compile": lambda fn: torch.compile(fn, backend="thunder_core"),
}


@pytest.fixture(params=sorted(FRONT_ENDS))
def compiled(request):
    torch._dynamo.reset()
    yield FRONT_ENDS[request.param]
    torch._dynamo.reset()


def _autocast_inside(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = a @ b
    return h.relu() + 1


def _branches_on_dtype(a, b):
    h = a @ b
    if h.dtype == torch.bfloat16:  # as Hugging Face's `if x.dtype == torch.float16: clamp`
        h = h.clamp(-1, 1)
    return h * 2


def _float32_block(a, b):
    # as Hugging Face's rotary embeddings: a block computed in float32 under any autocast
    with torch.autocast("cpu", enabled=False):
        angles = a.float() @ b.float()
    return angles.cos(), (a @ b).sin()


def _asks_for_autocast(a, b):
    h = a @ b
    return h * 3 if torch.is_autocast_enabled("cpu") else h


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g), torch.randn(16, 8, generator=g)


def _check(got, want):
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


def test_an_autocast_block_inside_the_function_runs_in_its_dtype(compiled):
    a, b = _inputs()
    fn = compiled(_autocast_inside)
    for _ in range(2):
        _check(fn(a, b), _autocast_inside(a, b))


@pytest.mark.parametrize("program", [_branches_on_dtype, _float32_block, _asks_for_autocast])
def test_code_under_autocast_around_the_call_sees_what_eager_sees(compiled, program):
    a, b = _inputs()
    fn = compiled(program)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = fn(a, b), program(a, b)
        _check(got, want)
    _check(fn(a, b), program(a, b))  # and without autocast, a program of its own


def test_training_under_autocast_gives_eagers_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    jmodel = thunder_core.jit(model)
    x = torch.randn(8, 16)
    grads = []
    for m in (model, jmodel):
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
        assert out.dtype == torch.bfloat16
        out.float().square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want)


def _float64_inside(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return a.double() @ b.double(), a @ b  # autocast leaves float64 alone


def test_autocast_leaves_float64_as_eager_does(compiled):
    a, b = _inputs()
    _check(compiled(_float64_inside)(a, b), _float64_inside(a, b))


@pytest.mark.parametrize("front_end", ["jit", "torch.compile"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_linear_with_bias_under_autocast_rounds_as_eager(front_end, dtype):
    """Eager adds a linear's bias inside the matrix product and rounds once; a product rounded to
    the low-precision dtype and then added (the bias add fused with the GELU after it) rounds
    twice, several units in the last place away (past ``assert_close``'s tolerance for the dtype)."""
    pytest.importorskip("thunder_executor_inductor")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    x = torch.randn(16, 64)
    if front_end == "jit":
        cmodel = thunder_core.jit(model, executors=["inductor"])
    else:
        torch._dynamo.reset()
        cmodel = torch.compile(model, backend="thunder_core", options={"executors": ["inductor"]})
    with torch.autocast("cpu", dtype=dtype):
        got, expected = cmodel(x), model(x)
    assert got.dtype == expected.dtype == dtype
    torch.testing.assert_close(got, expected)


def test_bfloat16_training_through_addmm_is_differentiated_by_thunder_core():
    """A bfloat16 ``addmm`` (Hugging Face GPT-2's Conv1D) stays whole, as eager rounds it; its
    gradient rule keeps the program differentiated by thunder_core, not handed whole to
    PyTorch's autograd."""
    torch.manual_seed(0)
    weight = torch.randn(16, 8, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(8, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(6, 16, dtype=torch.bfloat16)

    def conv1d(x, weight, bias):
        return torch.addmm(bias, x, weight).tanh()

    jfn = thunder_core.jit(conv1d)
    got = jfn(x, weight, bias)
    got.sum().backward()
    grads = weight.grad, bias.grad
    weight.grad = bias.grad = None
    expected = conv1d(x, weight, bias)
    expected.sum().backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grads, (weight.grad, bias.grad))
    backward = thunder_core.last_backward_traces(jfn)  # none when PyTorch's autograd records the program
    assert backward and "matmul" in str(backward[-1])
