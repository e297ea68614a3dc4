"""Symbolic sizes: one compile serves many sizes, checked against eager PyTorch."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from models import litgpt_gpt, token_batch

import thunder_core
from thunder_core import FusionExecutor
from thunder_core.capture.capture import capture
from thunder_core.capture.symbolic import SymbolicSizes
from thunder_core.executors import torch_executor
from thunder_core.executors.claiming import assign_executors


def _mlp(x, w):
    return (torch.nn.functional.gelu(x @ w) * 2).reshape(x.shape[0], -1).sum(-1)


def test_a_second_size_compiles_once_with_that_dimension_symbolic():
    w = torch.randn(8, 4)
    jfn = thunder_core.jit(_mlp)
    for n in (3, 5, 9, 12, 33, 2):
        x = torch.randn(n, 8)
        torch.testing.assert_close(jfn(x, w), _mlp(x, w))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 2, info.reasons  # the first size, then every other one
    assert info.reasons[1].endswith("symbolic sizes: x dim 0"), info.reasons
    source = str(thunder_core.last_traces(jfn)[-1])
    assert "s0 = x.shape[0]" in source and '# x: "cpu f32[s0, 8]"' in source, source


def test_dynamic_true_is_symbolic_from_the_first_call_and_false_compiles_each_size():
    w = torch.randn(8, 4)
    symbolic = thunder_core.jit(_mlp, dynamic=True)
    fixed = thunder_core.jit(_mlp, dynamic=False)
    for n in (3, 5, 9):
        x = torch.randn(n, 8)
        torch.testing.assert_close(symbolic(x, w), _mlp(x, w))
        torch.testing.assert_close(fixed(x, w), _mlp(x, w))
    assert thunder_core.cache_info(symbolic).entries == 1
    assert thunder_core.cache_info(fixed).entries == 3
    source = str(thunder_core.last_traces(symbolic)[-1])
    assert '# w: "cpu f32[s1, s2]"' in source, source  # x's dim 1 and w's dim 0 found equal: one symbol
    with pytest.raises(ValueError, match="dynamic='yes'"):
        thunder_core.jit(_mlp, dynamic="yes")


def test_a_size_that_equals_a_parameters_size_at_the_first_call_stays_symbolic():
    """A batch of 2 beside a bias of 2 elements (and of 4 beside one of 4): comparing the
    shapes (2,) and (s0, 2) for a shortcut compared 2 with s0 and fixed s0 to 2 (or excluded 4),
    so every later batch size compiled again."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
    for sizes in ((2, 5, 7), (3, 4, 9)):
        jfn = thunder_core.jit(model, dynamic=True)
        for n in sizes:
            x = torch.randn(n, 4, requires_grad=True)
            out, expected = jfn(x), model(x)
            torch.testing.assert_close(out, expected)
            got, want = torch.autograd.grad(out.sum(), x), torch.autograd.grad(expected.sum(), x)
            torch.testing.assert_close(got, want)
        info = thunder_core.cache_info(jfn)
        assert info.entries == 1, info.reasons
        assert info.reasons[0] == "first call; symbolic sizes: input dims 0, 1", info.reasons


def test_expanding_a_parameter_to_a_size_that_equals_its_length_stays_symbolic():
    bias = torch.randn(4)

    def fn(x):
        return bias.expand(x.shape[0], 4) * x

    jfn = thunder_core.jit(fn, dynamic=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jfn(x), fn(x))
    assert thunder_core.cache_info(jfn).entries == 1, thunder_core.cache_info(jfn).reasons


def _flat_pairs(x):
    return x.reshape(-1, 2).sum(1)


def test_a_backward_that_needs_sizes_none_of_its_inputs_has_takes_them_from_the_forward():
    """The gradient of ``x.reshape(-1, 2).sum(1)`` is reshaped back to ``x``'s sizes, and ``x``
    itself is not saved: the forward saves the sizes as ints (before, the backward could not be
    printed with symbolic sizes, and every size compiled again)."""
    jfn = thunder_core.jit(_flat_pairs, dynamic=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 4, requires_grad=True)
        (got,) = torch.autograd.grad(jfn(x).square().sum(), x)
        (want,) = torch.autograd.grad(_flat_pairs(x).square().sum(), x)
        torch.testing.assert_close(got, want)
    info = thunder_core.cache_info(jfn)
    assert info.entries == 1, info.reasons
    backward = str(thunder_core.last_backward_traces(jfn)[-1])
    assert "s0, s1, g" in backward and '# s0: "int s0"' in backward, backward


def _with_its_first_columns(x):
    return torch.cat([x, x[:, :2]], 1)


def test_a_region_takes_a_symbol_its_inputs_give_only_as_a_sum_as_an_int():
    """The backward of ``torch.cat([x, x[:, :2]], 1)`` reads ``s1`` from a gradient of ``s1 + 2``
    columns; the Inductor region takes ``s1`` itself as an int input (Inductor cannot read a
    symbol from a sum: it failed and the region ran with torch, with a warning)."""
    pytest.importorskip("thunder_executor_inductor")
    jfn = thunder_core.jit(_with_its_first_columns, executors=["inductor"], dynamic=True)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "error", message="thunder_core: executor"
        )  # a region that fails to compile warns
        for n in (4, 6, 9):
            x = torch.randn(n, 5, requires_grad=True)
            (got,) = torch.autograd.grad(jfn(x).square().sum(), x)
            (want,) = torch.autograd.grad(_with_its_first_columns(x).square().sum(), x)
            torch.testing.assert_close(got, want)
    assert thunder_core.cache_info(jfn).entries == 1
    backward = str(thunder_core.last_backward_traces(jfn)[-1])
    assert "_inductor_fusion_1(g" in backward and ", s1)" in backward and "s1 = (g" in backward, backward


def test_a_symbol_a_region_takes_as_an_int_stays_bound_for_the_operations_after_it():
    """The region around ``b1 + x.view(-1, 8) @ w1`` reads ``s0`` from a ``2*s0`` rows input, so it
    takes ``s0`` as an int; the ``del`` after its last use as an argument unbound it for the
    ``view`` to ``torch.Size([b, t, 8])`` after the region (an UnboundLocalError in training with
    the default automatic sizes)."""
    pytest.importorskip("thunder_executor_inductor")
    torch.manual_seed(0)
    w1, b1, w2 = (torch.randn(*shape, requires_grad=True) for shape in ((8, 16), (16,), (16, 8)))

    def mlp(x):
        b, t = x.shape[0], x.shape[1]
        h = torch.nn.functional.gelu((b1 + x.view(-1, 8) @ w1).view(b, t, 16))
        return (h.view(-1, 16) @ w2).view(torch.Size([b, t, 8])).sum(-1)

    jfn = thunder_core.jit(mlp, executors=["inductor"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_core: executor")
        for n in (6, 11, 8):
            x = torch.randn(2, n, 8, requires_grad=True)
            got = torch.autograd.grad(jfn(x).square().sum(), (x, w1, b1, w2))
            want = torch.autograd.grad(mlp(x).square().sum(), (x, w1, b1, w2))
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert thunder_core.cache_info(jfn).entries == 2
    forward = str([t for t in thunder_core.last_traces(jfn) if t.function_name == "forward"][-1])
    assert "_inductor_fusion_1(" in forward and ", s0)" in forward, forward


def _branchy(x):
    if x.shape[0] > 6:
        return x.sin()
    return x.cos() * x.shape[0]


def test_a_branch_on_a_size_gives_eagers_result_on_both_sides_and_names_the_guard():
    jfn = thunder_core.jit(_branchy, dynamic=True)
    for n in (3, 4, 8, 9, 5, 12):
        x = torch.randn(n, 2)
        torch.testing.assert_close(jfn(x), _branchy(x))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 2, info.reasons  # one program per side of the branch
    assert info.reasons[1].startswith("size guard failed: x.shape[0] <= 6"), info.reasons


def test_sizes_0_and_1_are_specialized():
    jfn = thunder_core.jit(lambda x: x.sum(0) + x.shape[0], dynamic=True)
    for n in (4, 1, 7, 0, 1):
        x = torch.randn(n, 3)
        torch.testing.assert_close(jfn(x), x.sum(0) + n)
    assert thunder_core.cache_info(jfn).entries == 3  # sizes >= 2, size 1, size 0
    auto = thunder_core.jit(lambda x: x * 2)
    for n in (5, 1):
        auto(torch.randn(n))
    assert "symbolic" not in thunder_core.cache_info(auto).reasons[1]  # size 1 is fixed: not tried


def test_a_recompile_names_the_guard_that_failed_not_a_size_guard_of_another_program():
    settings = {"scale": 2.0}

    def fn(x):
        return x * settings["scale"]

    jfn = thunder_core.jit(fn, dynamic=True)
    jfn(torch.randn(4, 3))  # symbolic: sizes of 2 and more
    jfn(torch.randn(1, 3))  # size 1: a program of its own
    settings["scale"] = 3.0
    x = torch.randn(1, 3)
    torch.testing.assert_close(jfn(x), x * 3.0)
    info = thunder_core.cache_info(jfn)
    assert info.entries == 3, info.reasons
    assert info.reasons[1].startswith("size guard failed: 2 <= x.shape[0]"), info.reasons
    assert "scale" in info.reasons[2] and "size guard" not in info.reasons[2], info.reasons


class _PerSize(FusionExecutor):
    """A fusion executor that compiles one kernel per size (it does not set takes_symbolic_sizes)."""

    def __init__(self):
        super().__init__("per_size")
        for op in ("exp", "add", "sin"):
            self.register_supported(op)

    def compile_region(self, region):
        return region.as_trace("region").python_callable()


def test_executors_that_compile_per_size_leave_symbolic_operations_to_others():
    x = torch.randn(5, 3)
    trace, _ = capture(
        lambda x: (x.exp() + 1).sin(),
        (x,),
        {},
        positional_names=["x"],
        symbolic_sizes=SymbolicSizes({0: frozenset({0})}),
    )
    claimed = assign_executors(trace, [_PerSize(), torch_executor.executor])
    (report,) = [d for d in claimed.decisions if d.bsym.symbol.name == "exp"]
    assert report.bsym.executor == "torch"
    assert "sizes are symbolic" in report.declined["per_size"], report


def test_numba_kernels_are_size_generic():
    # One compile for every size: the generated kernel reads its loop bounds from its inputs on
    # each call (an RMSNorm's mean divides by the row length, passed in too).
    pytest.importorskip("thunder_executor_numba")

    def f(x, w, b):
        y = torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=1e-6)
        return torch.nn.functional.silu(y) * 2 + b, (x * x).sum(-1, keepdim=True)

    jfn = thunder_core.jit(f, executors=["numba"], dynamic=True)
    for shape in ((3, 5, 64), (7, 2, 64), (130, 9, 64), (2, 2, 64), (4, 3, 33)):
        x = torch.randn(*shape)
        w, b = (torch.randn(shape[-1]) for _ in range(2))
        for got, expected in zip(jfn(x, w, b), f(x, w, b)):
            torch.testing.assert_close(got, expected)
    assert thunder_core.cache_info(jfn).entries == 1, thunder_core.cache_info(jfn).reasons
    reports = thunder_core.explain(jfn).operations
    assert {r.executor for r in reports} == {"numba"}, reports
    assert '"cpu f32[s0, s1, s2]" | executor: numba' in str(thunder_core.last_traces(jfn)[-1])


def _row_outputs(x, r, s):
    # One Numba row kernel: a per-row input (r), an output per row (S[:-1]), a per-row maximum
    # broadcast to the full shape as an output, and a one-element output.
    m = x.amax(-1, keepdim=True)
    return torch.softmax(x, -1) * r[..., None], (x * r[..., None]).sum(-1), m.expand_as(x) * 2.0, s * 3.0


@pytest.mark.parametrize("dynamic", [False, True])
def test_numba_row_kernels_write_every_kind_of_output(dynamic):
    pytest.importorskip("thunder_executor_numba")
    jfn = thunder_core.jit(_row_outputs, executors=["numba"], dynamic=dynamic)
    for n, c in ((4, 6), (9, 6), (5, 17)):
        x, r, s = torch.randn(n, c), torch.randn(n), torch.tensor(1.5)
        for got, expected in zip(jfn(x, r, s), _row_outputs(x, r, s)):
            torch.testing.assert_close(got, expected)
    ran = {r.executor for r in thunder_core.explain(jfn).operations if r.executor != "(decomposed)"}
    assert ran == {"numba"}, thunder_core.explain(jfn)  # one kernel computes all four outputs


def test_numba_declines_what_it_cannot_run_size_generic():
    pytest.importorskip("thunder_executor_numba")

    def outer(r, c):  # the iteration shape exists only inside the region: no input to read it from
        return (r.reshape(-1, 1) * c).exp() + 1

    jfn = thunder_core.jit(outer, executors=["numba"], dynamic=True)
    for n in (3, 8):
        r, c = torch.randn(n), torch.randn(n + 2)
        torch.testing.assert_close(jfn(r, c), outer(r, c))
    (report,) = thunder_core.explain(jfn).for_symbol("torch.exp")
    assert report.executor == "torch" and "no input of the iteration shape" in report.declined["numba"], (
        report
    )

    def one_row(x, w):
        return torch.nn.functional.linear(x, w)

    jlinear = thunder_core.jit(one_row, executors=["numba"], dynamic=True)
    x, w = torch.randn(1, 300), torch.randn(400, 300)
    torch.testing.assert_close(jlinear(x, w), one_row(x, w))
    (report,) = thunder_core.explain(jlinear).for_symbol("torch.nn.functional.linear")
    assert report.executor == "torch" and "fixed sizes only" in report.declined["numba"], report


def test_a_program_that_fixes_its_sizes_compiles_each_size_and_says_why():
    def padded(x):
        return torch.cat([x, torch.zeros(int(x.shape[0]) % 3, x.shape[1])])  # int(): a fixed size

    jfn = thunder_core.jit(padded)
    for n in (3, 4, 5, 6):
        x = torch.randn(n, 2)
        torch.testing.assert_close(jfn(x), padded(x))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 4, info.reasons
    assert info.reasons[1].endswith("sizes fixed: the program specializes x dim 0"), info.reasons
    assert "symbolic" not in info.reasons[2], info.reasons  # not tried again


def test_litgpt_forward_over_many_prompt_lengths_compiles_twice():
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64, vocab=256, block_size=128).eval()
    jmodel = thunder_core.jit(model)
    with torch.no_grad():
        for length in (8, 16, 24, 40, 64, 9):
            idx = token_batch(1, length, seed=length)
            torch.testing.assert_close(jmodel(idx), model(idx))
    info = thunder_core.cache_info(jmodel)
    assert info.entries == 2, info.reasons


@pytest.mark.parametrize("executors", [None, ["numba", "torch"]], ids=["default", "numba"])
def test_litgpt_training_over_sequence_lengths_gives_eagers_gradients(executors):
    if executors is not None:
        pytest.importorskip("thunder_executor_numba")
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64, vocab=256, block_size=128)
    jmodel = thunder_core.jit(model, executors=executors)
    for length in (8, 16, 24, 40, 12):
        idx = token_batch(2, length, seed=length)
        jmodel(idx).logsumexp(-1).mean().backward()
        ours = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        model(idx).logsumexp(-1).mean().backward()
        for got, param in zip(ours, model.parameters()):
            torch.testing.assert_close(got, param.grad)
        model.zero_grad(set_to_none=True)
    info = thunder_core.cache_info(jmodel)
    assert info.entries == 2, info.reasons
    if executors is not None:  # Numba's kernels ran in the symbolic program, forward and backward
        backward = thunder_core.last_backward_traces(jmodel)
        forward = [t for t in thunder_core.last_traces(jmodel) if all(t is not b for b in backward)]
        for trace in (forward[-1], backward[-1]):
            assert "executor: numba" in str(trace) and "s0" in str(trace), trace


@torch.library.custom_op("thunder_core_tests::fixed_sizes_only", mutates_args=())
def _fixed_sizes_only(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_fixed_sizes_only.register_fake
def _(x):  # a third-party operator whose fake kernel needs numbers for sizes
    if not isinstance(x.shape[-1], int):
        raise RuntimeError("this operator's fake kernel takes fixed sizes only")
    return torch.empty_like(x)


def test_a_program_that_cannot_be_captured_symbolically_keeps_fixed_sizes_and_says_why():
    def program(x):
        return _fixed_sizes_only(x) + 1

    jfn = thunder_core.jit(program)
    for n in (5, 9, 13):
        x = torch.randn(2, n)
        torch.testing.assert_close(jfn(x), program(x))
    reasons = thunder_core.cache_info(jfn).reasons
    assert "sizes fixed: compiling them symbolic failed" in reasons[1], reasons
    assert "takes fixed sizes only" in reasons[1], reasons
    assert "symbolic" not in reasons[2], reasons  # not tried again


def test_padding_computed_from_a_size_stays_symbolic():
    # constant_pad_nd's C++ kernel takes numbers only: PyTorch's Python kernel runs it (and the
    # CUDA attention kernels' mask alignment, which pads the same way)
    def pad_to_eight(x):
        return torch.nn.functional.pad(x, (0, math.ceil(x.shape[-1] / 8) * 8 - x.shape[-1])) * 2

    jfn = thunder_core.jit(pad_to_eight)
    for n in (5, 9, 13, 16):
        x = torch.randn(2, n)
        torch.testing.assert_close(jfn(x), pad_to_eight(x))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 3 and "symbolic sizes: x dim 1" in info.reasons[1], info.reasons
    assert info.reasons[2].startswith("size guard failed: "), info.reasons  # 16: no padding at all
    assert "failed" not in str(thunder_core.explain(jfn)), thunder_core.explain(jfn)  # Inductor's too


def test_a_slice_bound_computed_from_a_size_stays_symbolic():
    def trimmed(x):
        return x[:, : x.shape[1] - 1] + x[-2:].sum(0)[1:]

    jfn = thunder_core.jit(trimmed, dynamic=True)
    for n in (3, 6, 11):
        x = torch.randn(n, n + 2)
        torch.testing.assert_close(jfn(x), trimmed(x))
    assert thunder_core.cache_info(jfn).entries == 1, thunder_core.cache_info(jfn).reasons


def test_training_on_a_slice_of_a_longer_buffer_compiles_once_more_and_gives_eagers_gradients():
    # labels = tokens[:, 1:]: a row stride that is no size of any input gets a symbol of its own,
    # read from the input's stride; the backward's inputs are flattened (2 * s0) and s0 is
    # solved from their size.
    def loss(logits, labels):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    jloss = thunder_core.jit(loss)
    for length in (13, 17, 21, 30):
        labels = torch.randint(0, 8, (2, length + 1), generator=torch.Generator().manual_seed(length))[:, 1:]
        logits = torch.randn(2, length, 8, requires_grad=True)
        got = jloss(logits, labels)
        got.backward()
        ours, logits.grad = logits.grad, None
        expected = loss(logits, labels)
        expected.backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(ours, logits.grad)
    info = thunder_core.cache_info(jloss)
    assert info.entries == 2 and "symbolic sizes" in info.reasons[1], info.reasons
    forward_source = str(thunder_core.last_traces(jloss)[0])  # the captured program
    assert "= labels.stride(0)" in forward_source, forward_source
    backward_source = str(thunder_core.last_backward_traces(jloss)[-1])
    assert ".shape[0] // 2" in backward_source, backward_source


def _scores(keys, query):
    return (query @ keys.transpose(-1, -2)).softmax(-1)


def test_a_window_of_a_longer_buffer_compiles_once_more_with_its_strides_symbolic():
    # The last 5 positions of buffers of several lengths (what a sliding-window cache keeps):
    # the sizes never change, the strides do each time.
    jfn = thunder_core.jit(_scores)
    query = torch.randn(1, 2, 1, 32)
    for length in (6, 7, 9, 12, 5):
        keys = torch.randn(1, 2, length, 32)[:, :, -5:, :]
        torch.testing.assert_close(jfn(keys, query), _scores(keys, query))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 2 and info.reasons[1].endswith("symbolic sizes: keys strides"), info.reasons
    assert "= keys.stride(0)" in str(thunder_core.last_traces(jfn)[-1])
    transposed = torch.randn(1, 2, 32, 5).transpose(-1, -2)  # a layout the symbolic strides do not cover
    torch.testing.assert_close(jfn(transposed, query), _scores(transposed, query))


def test_a_symbolic_capture_runs_each_distinct_operation_on_fake_tensors_once(monkeypatch):
    """Operations repeated on the same symbolic sizes (a transformer's layers) take their output
    metadata from the capture's memo: fake tensors with symbolic sizes cost sympy arithmetic."""
    from thunder_core.capture import meta

    runs = []
    real = meta._fake_outputs
    monkeypatch.setattr(meta, "_fake_outputs", lambda *a, **k: runs.append(a[1]) or real(*a, **k))

    def repeated(x, times):
        out = x
        for _ in range(times):
            out = out + (x.sin() * 2).softmax(-1)
        return out

    counts = []
    for times in (1, 6):
        runs.clear()
        fn = thunder_core.jit(lambda x, times=times: repeated(x, times), dynamic=True, executors=["torch"])
        x = torch.randn(5, 8)
        torch.testing.assert_close(fn(x), repeated(x, times))
        counts.append(len(runs))
    assert counts[0] == counts[1], counts


def test_the_size_guard_reading_each_tensor_once_answers_as_torchs_printed_guard():
    # The guard of a program with a branch on a size, related sizes (x and the mask share s0 + 1)
    # and a slice's own stride symbol: its compiled form (each tensor's sizes and strides read
    # once) must accept and refuse exactly what torch's printed expression does.
    def program(x, mask, labels):
        if x.shape[0] > 4:
            x = x * 2
        return (x.sum(-1) + mask[: x.shape[0]]).sum() + labels.sum()

    jfn = thunder_core.jit(program, dynamic=True)
    buffer = torch.arange(40.0).reshape(2, 20)
    jfn(torch.randn(6, 3), torch.randn(7), buffer[:, 1:9])
    guard = thunder_core.inspection._function(jfn)._last.size_guard
    assert guard._reads_once is not None, guard.expression
    calls = [
        (torch.randn(n, c), torch.randn(m), buffer[:, 1 : 1 + k] if k else buffer[:1, :4])
        for n in (1, 2, 5, 9)
        for c in (3, 4)
        for m in (n, n + 1, n + 3)
        for k in (0, 3, 8)
    ]
    calls.append((torch.randn(3, 6)[:, :3], torch.randn(4), buffer[:, 1:5]))  # a strided x
    calls.append((torch.randn(6, 3, 1), torch.randn(7), buffer[:, 1:9]))  # another number of dims
    calls.append((torch.randn(6, 3), None, buffer[:, 1:9]))  # not a tensor
    answers = [(guard(list(call)), guard.evaluate(list(call))) for call in calls]
    assert all(fast == printed for fast, printed in answers), answers
    assert any(fast for fast, _ in answers) and not all(fast for fast, _ in answers)
