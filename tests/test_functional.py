"""``thunder_core.grad``, ``value_and_grad``, ``vjp``, ``jvp`` and ``vmap``: torch.func's signatures
and results, as trace transforms that nest and compile into one trace."""

from __future__ import annotations

import pytest
import torch

import thunder_core
from thunder_core.autodiff.fallback import AUTOGRAD_FALLBACK
from thunder_core.testing.models import small_litgpt

TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}


def _mlp_loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    hidden = torch.nn.functional.gelu(x @ params["w1"] + params["b1"])
    return torch.nn.functional.mse_loss(hidden @ params["w2"], y)


def _mlp(dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype)

    params = {"w1": randn(8, 16), "b1": randn(16), "w2": randn(16, 4)}
    return params, randn(5, 8), randn(5, 4)


def test_grad_of_a_loss_over_a_dict_of_parameters_is_torch_funcs():
    params, x, y = _mlp()
    ours = thunder_core.grad(_mlp_loss)(params, x, y)
    expected = torch.func.grad(_mlp_loss)(params, x, y)
    assert set(ours) == set(expected)
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], **TOLERANCE)


def test_value_and_grad_and_grad_and_value_with_argnums_and_aux():
    params, x, y = _mlp()

    def loss_and_hidden(params, x, y):
        hidden = x @ params["w1"]
        return _mlp_loss(params, x, y), {"hidden": hidden}

    ours = thunder_core.value_and_grad(loss_and_hidden, argnums=(0, 1), has_aux=True)(params, x, y)
    expected = torch.func.grad_and_value(loss_and_hidden, argnums=(0, 1), has_aux=True)(params, x, y)
    (value, aux), (param_grads, x_grad) = ours
    (e_param_grads, e_x_grad), (e_value, e_aux) = expected
    swapped = thunder_core.grad_and_value(loss_and_hidden, argnums=(0, 1), has_aux=True)(params, x, y)
    torch.testing.assert_close(swapped[1][0], value, rtol=0, atol=0)  # torch.func's order
    torch.testing.assert_close(value, e_value, **TOLERANCE)
    torch.testing.assert_close(aux["hidden"], e_aux["hidden"], **TOLERANCE)
    assert not aux["hidden"].requires_grad
    torch.testing.assert_close(x_grad, e_x_grad, **TOLERANCE)
    for name in e_param_grads:
        torch.testing.assert_close(param_grads[name], e_param_grads[name], **TOLERANCE)
    gradient, aux = thunder_core.grad(loss_and_hidden, argnums=1, has_aux=True)(params, x, y)
    torch.testing.assert_close(gradient, e_x_grad, **TOLERANCE)


def test_vjp_of_a_function_with_several_outputs_and_keyword_cotangents():
    x = torch.randn(3, 4, dtype=torch.float64)
    w = torch.randn(4, 4, dtype=torch.float64)

    def f(x, w):
        h = torch.tanh(x @ w)
        return {"h": h, "norm": h.norm(dim=1)}

    out, vjp_fn = thunder_core.vjp(f, x, w)
    e_out, e_vjp_fn = torch.func.vjp(f, x, w)
    cotangents = {"h": torch.randn(3, 4, dtype=torch.float64), "norm": torch.randn(3, dtype=torch.float64)}
    for ours, expected in zip([*out.values(), *vjp_fn(cotangents)], [*e_out.values(), *e_vjp_fn(cotangents)]):
        torch.testing.assert_close(ours, expected, **TOLERANCE)
    with pytest.raises(thunder_core.ThunderCoreError, match="shaped like the output"):
        vjp_fn(torch.ones(3, 4))


def _f(x):
    return (torch.sin(x) * x.pow(3)).sum()


def test_grad_of_grad_and_hessian_vector_products():
    x = torch.randn(6, dtype=torch.float64)
    v = torch.randn(6, dtype=torch.float64)
    second = thunder_core.grad(lambda x: thunder_core.grad(_f)(x).sum())(x)
    expected = torch.func.grad(lambda x: torch.func.grad(_f)(x).sum())(x)
    torch.testing.assert_close(second, expected, **TOLERANCE)
    # H v as the VJP of the gradient (H is symmetric), compiled into one trace.
    hvp = thunder_core.jit(lambda x, v: thunder_core.vjp(thunder_core.grad(_f), x)[1](v)[0])
    expected = torch.func.jvp(torch.func.grad(_f), (x,), (v,))[1]
    torch.testing.assert_close(hvp(x, v), expected, **TOLERANCE)


def test_jit_of_a_transformed_function_is_one_trace_without_fallback():
    params, x, y = _mlp(torch.float32)
    jitted = thunder_core.jit(thunder_core.grad(_mlp_loss))
    ours = jitted(params, x, y)
    expected = torch.func.grad(_mlp_loss)(params, x, y)
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], rtol=1e-5, atol=1e-5)
    traces = thunder_core.last_traces(jitted)
    assert not thunder_core.last_backward_traces(jitted)  # the gradient is computed in the one program
    assert not any(b.symbol.has_tag(AUTOGRAD_FALLBACK) for t in traces for b in t.bound_symbols)
    executed = str(traces[-1])
    assert "gelu" in executed and "matmul" in executed  # the forward and the backward, in one trace
    jitted(params, x, y)
    assert thunder_core.cache_info(jitted).hits == 1


def test_a_transform_called_outside_jit_compiles_once_per_signature():
    from thunder_core.functional import _COMPILED

    def g(x):
        return (x.cos() * x).sum()

    x = torch.randn(6)
    for step in range(3):  # written inline, as torch.func users write it: compiled once
        torch.testing.assert_close(thunder_core.grad(g)(x + step), torch.func.grad(g)(x + step))
    (compiled,) = _COMPILED[g].values()
    info = thunder_core.cache_info(compiled)
    assert info.entries == 1 and info.hits == 2
    out, vjp_fn = thunder_core.vjp(torch.sin, x)
    torch.testing.assert_close(vjp_fn(torch.ones(6))[0], torch.cos(x))
    out, vjp_fn = thunder_core.vjp(torch.sin, x + 1)  # the compiled forward and backward are reused
    torch.testing.assert_close(vjp_fn(torch.ones(6))[0], torch.cos(x + 1))


def test_grad_inside_a_jitted_function_and_with_keyword_arguments():
    x = torch.randn(4, 3)

    def scaled(x, *, scale):
        return (x.exp() * scale).sum()

    jitted = thunder_core.jit(lambda x: thunder_core.grad(scaled)(x, scale=3.0) + 1)
    torch.testing.assert_close(jitted(x), torch.func.grad(scaled)(x, scale=3.0) + 1)


def _litgpt_block():
    """A litgpt transformer block (width 64), its parameters as a dict and rotary tables for 16 tokens."""
    torch.manual_seed(0)
    model = small_litgpt(n_layer=1, n_embd=64, vocab=96, block_size=32)
    block = model.transformer.h[0]
    params = {name: p.detach() for name, p in block.named_parameters()}
    return block, params, model.cos[:16].unsqueeze(0), model.sin[:16].unsqueeze(0)


def test_grad_of_a_litgpt_block_through_functional_call():
    """Stateless training of a real transformer block: gradients of its parameters, given as a
    dict through torch.func.functional_call, equal torch.func's."""
    block, params, cos, sin = _litgpt_block()
    x = torch.randn(2, 16, 64)

    def loss(params, x):
        return torch.func.functional_call(block, params, (x, cos, sin)).pow(2).mean()

    ours = thunder_core.grad(loss, argnums=(0, 1))(params, x)
    expected = torch.func.grad(loss, argnums=(0, 1))(params, x)
    torch.testing.assert_close(ours[1], expected[1], rtol=1e-5, atol=1e-6)
    for name in expected[0]:
        torch.testing.assert_close(ours[0][name], expected[0][name], rtol=1e-5, atol=1e-6)


def test_bad_input_gets_a_clear_error():
    x = torch.randn(3)
    with pytest.raises(thunder_core.ThunderCoreError, match="one element"):
        thunder_core.grad(torch.sin)(x)
    with pytest.raises(thunder_core.ThunderCoreError, match="floating-point"):
        thunder_core.grad(lambda n: n.float().sum())(torch.arange(3))
    with pytest.raises(thunder_core.ThunderCoreError, match="argnums 2"):
        thunder_core.grad(_f, argnums=2)(x)
    with pytest.raises(thunder_core.ThunderCoreError, match=r"\(output, aux\)"):
        thunder_core.grad(_f, has_aux=True)(x)


def test_jvp_is_torch_funcs_also_of_a_gradient():
    x = torch.randn(4, 3, dtype=torch.float64)
    w = torch.randn(3, 3, dtype=torch.float64)
    tangents = (torch.randn_like(x), torch.randn_like(w))

    def f(x, w):
        return {"y": torch.tanh(x @ w) * x.sum(), "s": (x * w[0]).sum()}

    out, jvp_out = thunder_core.jvp(f, (x, w), tangents)
    e_out, e_jvp_out = torch.func.jvp(f, (x, w), tangents)
    for key in e_out:
        torch.testing.assert_close(out[key], e_out[key], **TOLERANCE)
        torch.testing.assert_close(jvp_out[key], e_jvp_out[key], **TOLERANCE)
    # Forward-over-reverse Hessian-vector product, compiled into one trace.
    v = torch.randn(6, dtype=torch.float64)
    y = torch.randn(6, dtype=torch.float64)
    hvp = thunder_core.jit(lambda y, v: thunder_core.jvp(thunder_core.grad(_f), (y,), (v,))[1])
    torch.testing.assert_close(hvp(y, v), torch.func.jvp(torch.func.grad(_f), (y,), (v,))[1], **TOLERANCE)
    with pytest.raises(thunder_core.ThunderCoreError, match="shaped like the primals"):
        thunder_core.jvp(f, (x, w), (tangents[0],))
    # An operation without a VJP rule (its gradient is PyTorch autograd's, at run time): its
    # jvp is torch.func's; a Hessian-vector product through it is refused with the reason, never
    # silently wrong (forward mode cannot push a tangent through autograd's saved graph).
    g = lambda y: torch.special.erfcx(y * 0.5).sum()  # noqa: E731
    u, t = torch.rand(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(
        thunder_core.jvp(g, (u,), (t,))[1], torch.func.jvp(g, (u,), (t,))[1], **TOLERANCE
    )
    with pytest.raises(thunder_core.ThunderCoreError, match="differentiated twice"):
        thunder_core.jit(lambda u, t: thunder_core.jvp(thunder_core.grad(g), (u,), (t,))[1])(u, t)
    # acos: a prim with a VJP rule, so its Hessian-vector product is thunder_core's own
    h = lambda y: torch.acos(y * 0.5).sum()  # noqa: E731
    torch.testing.assert_close(
        thunder_core.jit(lambda u, t: thunder_core.jvp(thunder_core.grad(h), (u,), (t,))[1])(u, t),
        torch.func.jvp(torch.func.grad(h), (u,), (t,))[1],
        **TOLERANCE,
    )


# --- torch.func on the OpInfo samples ------------------------------------------------------------

#: Where thunder_core.vjp / thunder_core.jvp are known to differ from torch.func or fail (first
#: float32 sample of each OpInfo that supports autograd), and why.
KNOWN_VJP_FAILURES = {
    "masked_select": "the output's shape depends on tensor data",
    "nn.functional.gaussian_nll_loss": "reads tensor data (a value check)",
    "nn.functional.rrelu": "random: another draw than torch.func's",
    "zero_": "in-place on a differentiated input: refused",
}
KNOWN_JVP_FAILURES = {
    "masked_select": "the output's shape depends on tensor data",
    "nn.functional.gaussian_nll_loss": "reads tensor data (a value check)",
    "nn.functional.rrelu": "random: another draw than torch.func's",
    "zero_": "in-place on a primal: refused with the reason, as by vjp",
}


def _opinfo_transform_sweep() -> dict:
    from thunder_core import functional
    from thunder_core.testing.opinfo import grad_cases, op_db, opinfo_id

    results = {
        "vjp": {"own": [], "fallback": [], "failed": {}},
        "jvp": {"passed": [], "failed": {}, "torch.func": [], "transposed": []},
    }
    transposed = []
    by_transposing = functional._jvp_by_transposing

    def count_transposed(*args, **kwargs):  # the whole function's JVP as the transpose of its VJP
        transposed.append(True)
        return by_transposing(*args, **kwargs)

    functional._jvp_by_transposing = count_transposed
    for opinfo in op_db():
        if not opinfo.supports_autograd:
            continue
        try:
            case = grad_cases(opinfo, n=1)[0]
        except Exception:  # noqa: BLE001 - no sample on this CPU: not counted
            continue
        leaves = [t.detach() for t in case.leaves]
        positions = [i for i, t in enumerate(leaves) if t.dtype.is_floating_point]

        def f(*xs, leaves=leaves, positions=positions, case=case):
            full = list(leaves)
            for i, x in zip(positions, xs):
                full[i] = x
            return case.fn(*full)

        primals = [leaves[i] for i in positions]
        try:
            out = f(*primals)
            if not (
                isinstance(out, torch.Tensor) and out.dtype.is_floating_point and out.layout == torch.strided
            ):
                continue
            cotangent = torch.randn_like(out)
            expected = torch.func.vjp(f, *primals)[1](cotangent)
            tangents = tuple(torch.randn_like(x) for x in primals)
            expected_jvp = torch.func.jvp(f, tuple(primals), tangents)[1]
        except Exception:  # noqa: BLE001 - torch.func itself cannot: not counted
            continue
        name = opinfo_id(opinfo)
        try:
            jitted = thunder_core.jit(lambda ct, *xs, f=f: thunder_core.vjp(f, *xs)[1](ct))
            torch.testing.assert_close(
                list(jitted(cotangent, *primals)), list(expected), atol=1e-4, rtol=1e-4, equal_nan=True
            )
            fallback = any(
                b.symbol.has_tag(AUTOGRAD_FALLBACK)
                for t in thunder_core.last_traces(jitted)
                for b in t.bound_symbols
            )
            results["vjp"]["fallback" if fallback else "own"].append(name)
        except Exception as error:  # noqa: BLE001 - reported by name below
            results["vjp"]["failed"][name] = f"{type(error).__name__}: {str(error)[:120]}"
        try:
            transposed.clear()
            jitted = thunder_core.jit(lambda xs, ts, f=f: thunder_core.jvp(f, xs, ts)[1])
            torch.testing.assert_close(
                jitted(tuple(primals), tangents), expected_jvp, atol=1e-4, rtol=1e-4, equal_nan=True
            )
            results["jvp"]["passed"].append(name)
            if transposed:
                results["jvp"]["transposed"].append(name)
            elif any("torch_func_jvp" in o.operation for o in thunder_core.explain(jitted).operations):
                results["jvp"]["torch.func"].append(name)
        except Exception as error:  # noqa: BLE001 - reported by name below
            results["jvp"]["failed"][name] = f"{type(error).__name__}: {str(error)[:120]}"
    functional._jvp_by_transposing = by_transposing
    return results


@pytest.mark.slow
def test_vjp_and_jvp_against_torch_func_on_the_opinfo_samples():
    results = _opinfo_transform_sweep()
    vjp, jvp = results["vjp"], results["jvp"]
    vjp_passed = len(vjp["own"]) + len(vjp["fallback"])
    vjp_total = vjp_passed + len(vjp["failed"])
    jvp_total = len(jvp["passed"]) + len(jvp["failed"])
    print(
        f"\nOpInfo transforms against torch.func (first float32 sample, CPU): vjp {vjp_passed}/{vjp_total} "
        f"({len(vjp['own'])} with thunder_core's own VJP rules, {len(vjp['fallback'])} with the PyTorch-autograd "
        f"fallback for some op, {len(vjp['failed'])} fail); jvp {len(jvp['passed'])}/{jvp_total} "
        f"({len(jvp['passed']) - len(jvp['torch.func']) - len(jvp['transposed'])} with thunder_core's forward-mode "
        f"rules only, {len(jvp['torch.func'])} with torch.func.jvp for some op, {len(jvp['transposed'])} as the "
        f"transpose of the VJP; {len(jvp['failed'])} fail)"
    )
    for name, reason in sorted(jvp["failed"].items()):
        print(f"  jvp {name}: {reason}")
    assert vjp_passed / vjp_total >= 0.98 and len(jvp["passed"]) / jvp_total >= 0.95
    for kind, known in (("vjp", KNOWN_VJP_FAILURES), ("jvp", KNOWN_JVP_FAILURES)):
        failed = results[kind]["failed"]
        assert not {k: v for k, v in failed.items() if k not in known}, f"new {kind} failures"
        assert not [
            k
            for k in known
            if k not in failed and k in results[kind].get("passed", vjp["own"] + vjp["fallback"])
        ], f"these {kind} cases now pass: remove them from the known failures"


VMAP_CASES = {
    # name: (function, in_dims, out_dims, per-argument shapes with the mapped dimension)
    "elementwise, an unbatched argument of higher rank": (
        lambda x, w: torch.tanh(x * w + 1) - torch.sigmoid(w),
        (0, None), 0, [(5, 4), (3, 4)],
    ),
    "mapped dimension 1, stacked in dimension 1": (lambda x: x.exp() / 2, 1, 1, [(3, 5, 4)]),
    "reductions with and without dim": (
        lambda x: x.sum() + x.mean(-1).sum() + x.amax(dim=(0,), keepdim=True).sum() + x.sum(1).sum(),
        0, 0, [(5, 3, 4)],
    ),
    "shapes: reshape, view, permute, transpose, unsqueeze, expand, t": (
        lambda x: x.reshape(12).view(3, 4).t().permute(1, 0).transpose(0, 1).unsqueeze(0).expand(2, 4, 3),
        0, 0, [(5, 3, 4)],
    ),
    "matmul: batched @ matrix, vector @ matrix, matrix @ batched, batched @ batched": (
        lambda a, v, b, c: ((a @ b).sum() + (v @ b).sum() + (b.T @ c).sum() + (a @ c).sum()),
        (0, 0, None, 0), 0, [(5, 3, 4), (5, 4), (4, 6), (5, 4, 2)],
    ),
    "matmul of an unbatched stack of matrices by a batched matrix": (
        lambda a, b: a @ b, (None, 0), 0, [(3, 2, 4), (5, 4, 6)],
    ),
    "linear and softmax": (
        lambda x, w, b: torch.softmax(torch.nn.functional.linear(x, w, b), -1),
        (0, None, None), 0, [(5, 2, 8), (4, 8), (4,)],
    ),
    "linear with a weight per example (ensembles), batched and unbatched inputs": (
        lambda x, w, b, v: torch.nn.functional.linear(x, w, b).sum(-1) + torch.nn.functional.linear(v, w).sum(),
        (None, 0, 0, 0), 0, [(3, 5, 8), (4, 6, 8), (4, 6), (4, 8)],
    ),
    "decompositions into prims, ops PyTorch tags pointwise, matrix ops": (
        lambda x, w, m: (
            torch.nn.functional.layer_norm(x, (4,), w).flip(0) * torch.special.erfcx(x)
            + torch.linalg.inv(m).sum()
        ),
        (0, None, 0), 0, [(5, 3, 4), (4,), (5, 3, 3)],
    ),
    "ops without a rule go through torch.func": (
        lambda x, y: torch.cumprod(torch.cat([x, y]), 0) + torch.flip(x, (0,)).sum(),
        (0, 0), 0, [(5, 3), (5, 3)],
    ),
    "tuple of outputs with their own out_dims, an unbatched output": (
        lambda x, w: (x @ w, w.sum(0)),
        (0, None), (1, 0), [(5, 2, 3), (3, 4)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", VMAP_CASES)
def test_vmap_is_torch_funcs(case):
    fn, in_dims, out_dims, shapes = VMAP_CASES[case]
    torch.manual_seed(0)
    args = [torch.randn(shape, dtype=torch.float64) for shape in shapes]
    expected = torch.func.vmap(fn, in_dims=in_dims, out_dims=out_dims)(*args)
    torch.testing.assert_close(thunder_core.vmap(fn, in_dims=in_dims, out_dims=out_dims)(*args), expected)
    jitted = thunder_core.jit(lambda *a: thunder_core.vmap(fn, in_dims=in_dims, out_dims=out_dims)(*a))
    torch.testing.assert_close(jitted(*args), expected)
    mapped_by_torch = [o for o in thunder_core.explain(jitted).operations if "torch_func_vmap" in o.operation]
    assert bool(mapped_by_torch) == (case == "ops without a rule go through torch.func"), mapped_by_torch


VMAP_EDGE_CASES = {
    # name: (function, in_dims, per-argument shapes with the mapped dimension)
    "type_as and to of an unbatched tensor": (
        lambda x, b: x * b.type_as(x) + b.to(x), (0, None), [(3, 3), (3,)],
    ),
    "attention over (L, E) examples": (
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        0, [(2, 4, 8)] * 3,
    ),
    "list indices split by a slice": (lambda x: x[[0, 1], :, [1, 2]], 0, [(2, 3, 4, 5)]),
    "a batched fill value": (
        lambda v: torch.zeros(4).masked_fill(torch.tensor([True, False, True, False]), v), 0, [(5,)],
    ),
    "sum over no dims": (lambda x: x.sum(dim=[]) + x.amax(dim=(0,), keepdim=True).sum(), 0, [(4, 3, 2)]),
    "view as another dtype": (lambda x: x.view(torch.int32).float(), 0, [(3, 4)]),
}  # fmt: skip


@pytest.mark.parametrize("case", VMAP_EDGE_CASES)
def test_vmap_edge_cases_are_torch_funcs(case):
    fn, in_dims, shapes = VMAP_EDGE_CASES[case]
    torch.manual_seed(0)
    args = [torch.randn(shape) for shape in shapes]
    expected = torch.func.vmap(fn, in_dims=in_dims)(*args)
    torch.testing.assert_close(thunder_core.vmap(fn, in_dims=in_dims)(*args), expected)


def test_jvp_of_prims_uses_thunder_cores_own_rules():
    """Decompositions into prims carry tangents by rules of thunder_core's, ties included
    (maximum of equal values, a maximum reached twice share the tangent as PyTorch's do)."""

    def f(a, b, i):
        tied = torch.maximum(a, a.flip(0)) + torch.cat([a, a]).amax(0) + torch.amin(b, 1).sum()
        picked = torch.gather(b, 1, i).sum() + torch.zeros(3, 4, dtype=b.dtype).scatter(1, i, b[:, :2]).sum()
        others = torch.asin(a.tanh() * 0.5) + torch.atan2(a, a.exp()) + torch.floor(a) + (a > 0) * a
        return tied.sum() + picked.sum() + b.var(1).sum() + others.sum() + torch.fmod(b, 0.7).sum()

    a, b = torch.randn(5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    i = torch.tensor([[0, 2], [1, 1], [3, 0]])
    tangents = (torch.randn_like(a), torch.randn_like(b))
    jitted = thunder_core.jit(
        lambda a, b, ta, tb: thunder_core.jvp(lambda a, b: f(a, b, i), (a, b), (ta, tb))
    )
    expected = torch.func.jvp(lambda a, b: f(a, b, i), (a, b), tangents)
    torch.testing.assert_close(jitted(a, b, *tangents), expected, **TOLERANCE)
    assert not [o for o in thunder_core.explain(jitted).operations if "torch_func_jvp" in o.operation]


def test_per_example_gradients_through_ops_differentiated_by_pytorch_autograd():
    """conv2d, max_pool2d (no VJP rule of thunder_core's: PyTorch autograd differentiates them)
    under vmap(grad): the op batched, its backward as torch.func.vjp of it, mapped. Also an op of
    unbatched parameters whose gradient is per example."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(36, 5),
    )
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, scale = torch.randn(6, 1, 8, 8), torch.randn(6)

    def loss(params, x, scale):
        out = torch.func.functional_call(model, params, (x.unsqueeze(0),))
        return out.square().mean() + torch.special.erfcx(params["4.bias"]).sum() * scale

    per_example = thunder_core.jit(
        lambda p, x, s: thunder_core.vmap(thunder_core.grad(loss), in_dims=(None, 0, 0))(p, x, s)
    )
    expected = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, scale)
    got = per_example(params, x, scale)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5)
    operations = [o.operation for o in thunder_core.explain(per_example).operations]
    assert any("torch_func_vmap_vjp" in o for o in operations)
    assert not any("autograd_fallback_backward" in o for o in operations)


def test_rules_keep_pytorchs_semantics_at_the_edges():
    # x[i] = v changes x's tangent though it returns nothing: refused as other in-place updates
    def overwrite(x, y):
        z = x.clone()
        z[0] = y[0]
        return z * 1.0

    x, y, t = torch.randn(3), torch.randn(3), (torch.ones(3), torch.full((3,), 5.0))
    with pytest.raises(thunder_core.ThunderCoreError, match="in-place"):
        thunder_core.jvp(overwrite, (x, y), t)
    # var over the dims of a 0-d example reduces nothing (not the batch)
    for fn in (
        lambda a: torch.var(a, correction=0),
        lambda a: torch.masked_fill(a, torch.tensor(True), a.var(correction=0)),
    ):
        torch.testing.assert_close(
            thunder_core.vmap(fn)(torch.randn(5)), torch.func.vmap(fn)(torch.randn(5)) * 0
        )
    # a batched 0-d example keeps 0-d type promotion: float64 0-d with float32 gives float32
    xd, yf = torch.randn(5, dtype=torch.float64), torch.randn(3)
    for op in (torch.atan2, torch.add):
        ours, theirs = (
            thunder_core.vmap(op, in_dims=(0, None))(xd, yf),
            torch.func.vmap(op, in_dims=(0, None))(xd, yf),
        )
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs)
    # a matrix passed by keyword
    m = torch.randn(4, 3, 3, dtype=torch.float64)
    inverse = lambda m: torch.linalg.inv(A=m)  # noqa: E731
    torch.testing.assert_close(thunder_core.vmap(inverse)(m), torch.func.vmap(inverse)(m))
    # remainder's and fmod's gradients in the divisor use PyTorch's rounding divisions
    a, b = torch.tensor([1.0, 5.0], dtype=torch.float64), torch.tensor([0.1, 0.1], dtype=torch.float64)
    for op in (torch.remainder, torch.fmod):
        f = lambda a, b, op=op: op(a, b).sum()  # noqa: E731
        torch.testing.assert_close(thunder_core.grad(f, argnums=1)(a, b), torch.func.grad(f, argnums=1)(a, b))
        tangents = (torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
        torch.testing.assert_close(thunder_core.jvp(f, (a, b), tangents), torch.func.jvp(f, (a, b), tangents))


def test_jvp_edge_cases_are_torch_funcs_or_refused():
    x, t = torch.randn(4), torch.randn(4)
    for fn, primal in (
        (lambda a: a.view(torch.float16), x),  # bits reinterpreted: not linear
        (lambda a: a**0, torch.zeros(4)),  # 1 everywhere, also at 0
        (lambda a: torch.view_as_complex(a.reshape(2, 2)).abs(), x),  # complex: torch.func.jvp's formula
    ):
        torch.testing.assert_close(
            thunder_core.jvp(fn, (primal,), (t,))[1], torch.func.jvp(fn, (primal,), (t,))[1], equal_nan=True
        )

    def through_a_view(a):
        b = a * 1
        b[0].mul_(2)  # writes through the view into b
        return b

    with pytest.raises(thunder_core.ThunderCoreError, match="in-place"):
        thunder_core.jvp(through_a_view, (torch.randn(3, 2),), (torch.randn(3, 2),))


def test_per_example_gradients_and_ensembles_through_functional_call():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(params, x, y):
        logits = torch.func.functional_call(model, params, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(logits, y.unsqueeze(0))

    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    expected = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    per_example = thunder_core.jit(thunder_core.vmap(thunder_core.grad(loss), in_dims=(None, 0, 0)))
    ours = per_example(params, x, y)
    for name in expected:
        assert ours[name].shape == (6, *params[name].shape)
        torch.testing.assert_close(ours[name], expected[name], rtol=1e-5, atol=1e-6)
    traces = thunder_core.last_traces(per_example)
    assert not any(b.symbol.has_tag(AUTOGRAD_FALLBACK) for t in traces for b in t.bound_symbols)
    # Ensembles: 3 models' parameters stacked, each model run on the same inputs.
    members = [torch.nn.Linear(8, 4) for _ in range(3)]
    stacked, _ = torch.func.stack_module_state(members)
    base = torch.nn.Linear(8, 4).to("meta")

    def run(params, x):
        return torch.func.functional_call(base, params, (x,))

    torch.testing.assert_close(
        thunder_core.vmap(run, in_dims=(0, None))(stacked, x), torch.stack([m(x) for m in members]).detach()
    )


def test_functional_call_of_a_jitted_module_with_the_transforms():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    jitted = thunder_core.jit(model)
    params = {name: p.detach() * 2 for name, p in model.named_parameters()}
    x = torch.randn(3, 4)
    torch.testing.assert_close(
        torch.func.functional_call(jitted, params, (x,)), torch.func.functional_call(model, params, (x,))
    )

    def loss(module):
        return lambda p, x: torch.func.functional_call(module, p, (x,)).square().sum()

    ours = thunder_core.grad(loss(jitted))(params, x)
    expected = torch.func.grad(loss(model))(params, x)
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name])
    per_example = thunder_core.vmap(thunder_core.grad(loss(jitted)), in_dims=(None, 0))(params, x)
    torch.testing.assert_close(
        per_example["0.weight"],
        torch.func.vmap(torch.func.grad(loss(model)), in_dims=(None, 0))(params, x)["0.weight"],
    )
    torch.testing.assert_close(jitted(x), model(x))  # its own parameters again afterwards


def test_vmap_nests_with_itself_and_under_grad():
    a, b = torch.randn(3, 5), torch.randn(4, 5)
    pairwise = thunder_core.vmap(
        thunder_core.vmap(lambda u, v: (u * v).sum(), in_dims=(None, 0)), in_dims=(0, None)
    )
    torch.testing.assert_close(pairwise(a, b), a @ b.T)
    w, x = torch.randn(5, 3), torch.randn(6, 5)

    def total(w, x, transforms):
        return transforms.vmap(lambda xi: torch.sin(xi @ w).sum())(x).sum()

    torch.testing.assert_close(
        thunder_core.grad(total)(w, x, thunder_core), torch.func.grad(total)(w, x, torch.func)
    )


def test_per_example_gradients_of_a_litgpt_block():
    block, params, cos, sin = _litgpt_block()
    x = torch.randn(4, 16, 64)

    def loss(params, example):
        return torch.func.functional_call(block, params, (example.unsqueeze(0), cos, sin)).pow(2).mean()

    expected = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    per_example = thunder_core.jit(thunder_core.vmap(thunder_core.grad(loss), in_dims=(None, 0)))
    ours = per_example(params, x)
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], rtol=1e-4, atol=1e-5)
    # Every operation batched by a rule (attention, its backward, the rotary slices and cats):
    # nothing left to torch.func, so the executors fuse the whole program.
    assert not [
        o.operation for o in thunder_core.explain(per_example).operations if "torch_func_vmap" in o.operation
    ]


def test_vmap_bad_input_and_randomness():
    x = torch.randn(4, 3)
    with pytest.raises(thunder_core.ThunderCoreError, match="different sizes"):
        thunder_core.vmap(torch.add)(x, torch.randn(5, 3))
    with pytest.raises(thunder_core.ThunderCoreError, match="no input is mapped"):
        thunder_core.vmap(torch.sin, in_dims=None)(x)
    with pytest.raises(thunder_core.ThunderCoreError, match="one entry per positional argument"):
        thunder_core.vmap(torch.add, in_dims=(0,))(x, x)
    with pytest.raises(thunder_core.ThunderCoreError, match="in place"):
        thunder_core.vmap(lambda v: (v * 2).add_(1))(x)
    with pytest.raises(thunder_core.ThunderCoreError, match="randomness must be one of"):
        thunder_core.vmap(torch.sin, randomness="maybe")
    dropout = lambda v: torch.nn.functional.dropout(v, 0.5)  # noqa: E731
    with pytest.raises(
        RuntimeError, match="randomness"
    ):  # torch.func's own error, as torch.func.vmap raises it
        thunder_core.vmap(dropout)(x)
    with pytest.raises(thunder_core.ThunderCoreError, match="randomness='different'"):
        thunder_core.vmap(lambda v: v + torch.rand(3))(x)
    evaluation = lambda v: torch.nn.functional.dropout(v, 0.5, training=False)  # noqa: E731
    torch.testing.assert_close(
        thunder_core.vmap(evaluation)(x), x
    )  # draws nothing: allowed, as in torch.func
    ones = torch.ones(64, 32)
    different = thunder_core.vmap(dropout, randomness="different")(ones)
    assert set(different.unique().tolist()) <= {0.0, 2.0}
    assert not all(torch.equal(different[0], row) for row in different[1:])  # each example its own draw
    same = thunder_core.vmap(dropout, randomness="same")(ones)
    assert all(torch.equal(same[0], row) for row in same[1:])  # one draw for all


def _opinfo_vmap_sweep() -> dict:
    """thunder_core.vmap against torch.func.vmap on each OpInfo's first float32 sample, every tensor
    argument batched (3 examples: the sample and two random ones of its shape; integer and
    boolean tensors repeated, as they are often indices)."""
    from thunder_core.testing.opinfo import draws_random_numbers, op_db, opinfo_id, sample_cases

    results = {"own": [], "torch.func": [], "failed": {}}
    for opinfo in op_db():
        if draws_random_numbers(opinfo):  # uninitialized memory or random draws: nothing to compare
            continue
        try:
            case = sample_cases(opinfo, n=1)[0]
        except Exception:  # noqa: BLE001 - no sample on this CPU: not counted
            continue
        if not case.leaves or any(t.layout != torch.strided for t in case.leaves):
            continue
        generator = torch.Generator().manual_seed(0)
        try:
            batched = [
                torch.stack(
                    [t, *(torch.randn(t.shape, generator=generator, dtype=t.dtype) for _ in range(2))]
                )
                if t.dtype.is_floating_point
                else torch.stack([t] * 3)
                for t in case.leaves
            ]
            expected = torch.func.vmap(case.fn)(*batched)
        except Exception:  # noqa: BLE001 - torch.func itself cannot (data-dependent shapes, ...): not counted
            continue
        name = opinfo_id(opinfo)
        try:
            jitted = thunder_core.jit(lambda *xs, fn=case.fn: thunder_core.vmap(fn)(*xs))
            torch.testing.assert_close(jitted(*batched), expected, atol=1e-4, rtol=1e-4, equal_nan=True)
            ops = thunder_core.explain(jitted).operations
            results["torch.func" if any("torch_func_vmap" in o.operation for o in ops) else "own"].append(
                name
            )
        except Exception as error:  # noqa: BLE001 - reported by name below
            results["failed"][name] = f"{type(error).__name__}: {str(error)[:120]}"
    return results


#: Where thunder_core.vmap is known to differ from torch.func.vmap or fail, and why.
KNOWN_VMAP_FAILURES = {
    "resize_": "an in-place resize: refused by capture (outside vmap too)",
    "zero_": "in place on a mapped value: refused with the reason",
    "resize_as_": "in place on a mapped value: refused with the reason",
}


@pytest.mark.slow
def test_vmap_against_torch_func_on_the_opinfo_samples():
    results = _opinfo_vmap_sweep()
    passed = len(results["own"]) + len(results["torch.func"])
    total = passed + len(results["failed"])
    print(
        f"\nOpInfo vmap against torch.func (first float32 sample, 3 examples, CPU): {passed}/{total} "
        f"({len(results['own'])} with thunder_core's batching rules only, {len(results['torch.func'])} with "
        f"torch.func.vmap for some op, {len(results['failed'])} fail)"
    )
    for name, reason in sorted(results["failed"].items()):
        print(f"  {name}: {reason}")
    assert not {k: v for k, v in results["failed"].items() if k not in KNOWN_VMAP_FAILURES}, (
        "new vmap failures"
    )
    assert not [k for k in KNOWN_VMAP_FAILURES if k not in results["failed"]], "remove these: they pass now"


def test_torch_func_transforms_of_a_jitted_function_or_module_run_it_eagerly():
    """torch.func's own transforms over a jitted function (its wrapped tensors have no storage for a
    compiled program): the original Python runs, with torch.func's results and one warning."""
    x = torch.randn(3, 4)
    jitted = thunder_core.jit(_f)
    jitted(x)  # a compiled entry for these sizes exists
    with pytest.warns(UserWarning, match="inside a torch.func transform"):
        torch.testing.assert_close(torch.func.grad(jitted)(x), torch.func.grad(_f)(x))
    batch = torch.randn(5, 3, 4)
    torch.testing.assert_close(torch.func.vmap(jitted)(batch), torch.func.vmap(_f)(batch))

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    jitted_model = thunder_core.jit(model)
    with torch.no_grad():
        jitted_model(x)
    params = {name: torch.randn_like(p) for name, p in model.named_parameters()}

    def loss(module):
        return lambda params, x: torch.func.functional_call(module, params, (x,)).pow(2).sum()

    expected = torch.func.grad(loss(model))(params, x)
    with pytest.warns(UserWarning, match="inside a torch.func transform"):
        via_torch_func = torch.func.grad(loss(jitted_model))(params, x)
    compiled = thunder_core.grad(loss(jitted_model))(params, x)  # stateless training, compiled
    for name in expected:
        torch.testing.assert_close(via_torch_func[name], expected[name], **TOLERANCE)
        torch.testing.assert_close(compiled[name], expected[name], rtol=1e-5, atol=1e-6)
