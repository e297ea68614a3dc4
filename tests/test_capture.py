"""Capture: what jit accepts, what it refuses, and how unknown ops are handled."""

from __future__ import annotations

import pytest
import torch

import thunder_core
from thunder_core import CaptureError, DataDependentError


def test_nested_structures_kwargs_and_numbers():
    def fn(xs, cfg, *, bias, scale=2):
        a, b = xs
        return {"sum": (a + b) * cfg["w"] + bias, "list": [a * scale, cfg["n"]]}

    jfn = thunder_core.jit(fn)
    xs = (torch.randn(3), torch.randn(3))
    cfg = {"w": torch.randn(3), "n": 4}
    bias = torch.randn(3)
    torch.testing.assert_close(jfn(xs, cfg, bias=bias, scale=3), fn(xs, cfg, bias=bias, scale=3))


def test_factories_inside_the_function():
    def fn(x):
        n = x.shape[-1]
        mask = torch.ones(n, n).tril().bool()
        pos = torch.arange(n) * 2
        return torch.where(mask, x, 0.0) + pos + torch.zeros_like(x) + torch.full((n, n), 3.0)

    x = torch.randn(5, 5)
    torch.testing.assert_close(thunder_core.jit(fn)(x), fn(x))


def test_unregistered_op_is_captured_as_an_opaque_call():
    def fn(x):
        return torch.gradient(x, dim=0)[0] + torch.special.bessel_j0(x)

    x = torch.randn(4, 3)
    jfn = thunder_core.jit(fn)
    torch.testing.assert_close(jfn(x), fn(x))
    source = thunder_core.last_traces(jfn)[0].python()
    assert "torch.gradient(x, dim=0)" in source
    assert "opaque: no thunder_core symbol, run by the torch executor" in source
    # An op without a decomposition is still a named symbol, not an opaque call.
    (leaf,) = [line for line in source.splitlines() if "= torch.special.bessel_j0(x)" in line]
    assert "opaque" not in leaf


def test_branch_on_tensor_data_names_the_line_and_the_ways_out():
    def fn(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(DataDependentError) as info:
        thunder_core.jit(fn)(torch.randn(3))
    message = str(info.value)
    assert "test_capture.py" in message and "if x.sum() > 0:" in message
    assert "torch.where" in message and "Python bool" in message


def test_item_is_refused_as_data_dependent():
    with pytest.raises(DataDependentError, match="Tensor.item"):
        thunder_core.jit(lambda x: x * x.max().item())(torch.randn(3))


_LSTM = torch.nn.LSTM(4, 8, batch_first=True)


def _packed_lstm(x, lengths):
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    return torch.nn.utils.rnn.pad_packed_sequence(_LSTM(packed)[0], batch_first=True)[0]


@pytest.mark.parametrize(
    "fn, args, where",
    [
        (
            lambda x, r: torch.repeat_interleave(x, r, dim=0),
            (torch.randn(3, 2), torch.tensor([1, 0, 2])),
            "repeat_interleave",
        ),
        (_packed_lstm, (torch.randn(3, 5, 4), torch.tensor([5, 2, 3])), "pack_padded_sequence"),
        # no meta kernel: its sizes were learned from a run on sample data (an all-False mask),
        # and `y.shape[0]` froze 0 into the trace (a silent wrong result)
        (
            lambda x, m: x[m] * x[m].shape[0],
            (torch.randn(5), torch.tensor([True, False, True, True, False])),
            "boolean mask as an index",
        ),
    ],
    ids=["repeat_interleave by a tensor", "pack_padded_sequence", "a boolean mask as an index"],
)
def test_an_operation_whose_sizes_come_from_tensor_values_is_refused_as_data_dependent(fn, args, where):
    # PyTorch's own message spoke of meta tensors, which the user never made
    with pytest.raises(DataDependentError, match=where) as info:
        thunder_core.jit(fn)(*args)
    assert "meta" not in str(info.value) and "torch.where" in str(info.value)


@pytest.mark.parametrize("change", ["t_", "unsqueeze_"])
def test_an_in_place_change_of_sizes_is_refused_with_the_way_out(change):
    # A proxy's sizes are fixed: recorded as they were, later operations would be compiled for
    # the wrong sizes (Inductor refused them; the results relied on the torch executor).
    def fn(x):
        y = x * 2
        y.t_() if change == "t_" else y.unsqueeze_(0)
        return y.sum(0) + 1, y

    message = change.removesuffix("_")
    with pytest.raises(CaptureError, match=rf"{change} changes the sizes or strides .*y = y\.{message}\("):
        thunder_core.jit(fn)(torch.randn(3, 5))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_an_in_place_update_that_keeps_the_sizes_is_captured(requires_grad, dynamic):
    # On slices with gaps in memory too: with grad, their stand-ins are contiguous copies.
    def fn(x):
        y = x * 2
        y.add_(1).mul_(3)
        y[:, 1:] += 1
        y[:, 0].zero_()
        torch.relu_(y[:, ::2])
        return y.sum(0), y

    x = torch.randn(3, 5, requires_grad=requires_grad)
    for got, expected in zip(thunder_core.jit(fn, dynamic=dynamic)(x), fn(x)):
        torch.testing.assert_close(got, expected)


def test_an_out_tensor_that_would_be_resized_is_refused_with_the_way_out():
    with pytest.raises(CaptureError, match=r"would resize its out= tensor \(\(0,\) -> \(3, 5\)\)"):
        thunder_core.jit(lambda x, o: torch.add(x, 1, out=o))(torch.randn(3, 5), torch.empty(0))


def test_branch_on_shapes_and_python_values_is_specialized():
    def fn(x, flag):
        if x.shape[0] > 2 and flag:
            return x * 2
        return x - 1

    jfn = thunder_core.jit(fn)
    for shape, flag in [((3,), True), ((3,), False), ((1,), True)]:
        x = torch.randn(shape)
        torch.testing.assert_close(jfn(x, flag), fn(x, flag))
    assert thunder_core.cache_info(jfn).entries == 3


def test_unsupported_argument_type_names_the_argument():
    class Config:  # no attributes of its own to walk (plain objects are taken: tests/test_objects.py)
        __slots__ = ("size",)

    def fn(x, cfg):
        return x

    with pytest.raises(TypeError, match=r"argument 'cfg' has type .*Config"):
        thunder_core.jit(fn)(torch.randn(2), Config())
    with pytest.raises(TypeError, match=r"argument 'args\[1\]\[0\]'"):
        thunder_core.jit(lambda *xs: xs[0])(torch.randn(2), [object()])


def test_inplace_ops_on_inputs_keep_eager_semantics():
    def fn(x, y):
        x.add_(1)
        y[0] = 5.0
        return x * 2, y.sum()

    a, b = torch.randn(3), torch.randn(3)
    a2, b2 = a.clone(), b.clone()
    expected = fn(a2, b2)
    jfn = thunder_core.jit(fn)
    actual = jfn(a, b)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(a, a2)  # the caller sees the mutation, as in eager
    torch.testing.assert_close(b, b2)
    # and again from the cache: the mutation happens on every call
    jfn(a, b)
    fn(a2, b2)
    torch.testing.assert_close(a, a2)


def test_inplace_on_a_leaf_that_requires_grad_raises_like_eager():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        thunder_core.jit(lambda w: w.mul_(2))(w)


def test_views_alias_like_eager():
    def fn(x):
        v = x.view(2, 3)
        v.mul_(2)
        return x.clone(), v.transpose(0, 1).contiguous()

    x = torch.randn(6)
    x2 = x.clone()
    torch.testing.assert_close(thunder_core.jit(fn)(x), fn(x2))


def test_gradients_flow_through_the_compiled_function():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)

    def loss(w, x):
        return torch.nn.functional.gelu(x @ w).pow(2).mean()

    thunder_core.jit(loss)(w, x).backward()
    grad = w.grad.clone()
    w.grad = None
    loss(w, x).backward()
    torch.testing.assert_close(grad, w.grad)


def test_returning_an_opaque_object_is_a_clear_error():
    class Slotted:  # its state is not in vars(): thunder_core cannot make it again
        __slots__ = ("t",)

        def __init__(self, t):
            self.t = t

    with pytest.raises(TypeError, match="cannot look inside"):
        thunder_core.jit(lambda x: Slotted(x))(torch.randn(2))


def test_a_returned_plain_object_holds_the_callers_tensor():
    class Box:
        def __init__(self, t):
            self.t = t

    x = torch.randn(2)
    box = thunder_core.jit(lambda x: Box(x))(x)
    assert type(box) is Box and box.t is x


def test_repeated_calls_with_the_same_metadata_reuse_meta_results_but_respect_grad_mode_and_aliasing():
    # Output metadata is memoized on the call's metadata; grad mode, requires_grad and which
    # arguments are the same tensor are part of that key.
    def fn(x, y):
        a = x * y
        with torch.no_grad():
            b = x * y
        c = x * x
        d = y.detach() * y.detach()
        return a, b, c, d

    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    expected = fn(x, y)
    actual = thunder_core.jit(fn)(x, y)
    assert (
        [t.requires_grad for t in actual] == [t.requires_grad for t in expected] == [True, False, True, False]
    )
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)


def _vmapped_inside(x, w):
    return torch.func.vmap(lambda row: torch.sin(row) @ w)(x)


_bound_before_capture = torch.func.vmap


def _vmap_bound_by_name(x, w):
    return _bound_before_capture(lambda row: torch.sin(row) @ w)(x)


def _grad_inside(x):
    return torch.func.grad(lambda v: torch.sin(v).sum())(x)


@pytest.mark.parametrize("fn", [_grad_inside, _vmap_bound_by_name], ids=["grad", "vmap bound before capture"])
def test_a_torch_func_transform_inside_the_jitted_function_is_refused_with_the_way_out(fn):
    # The transform's batched tensors reached capture's proxies, which failed far from the cause
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    args = (x,) if fn is _grad_inside else (x, w)
    with pytest.raises(CaptureError, match="torch.func transform") as info:
        thunder_core.jit(fn)(*args)
    assert "test_capture.py" in str(info.value) and "torch.func.vmap(thunder_core.jit(f))" in str(info.value)
    assert torch.vmap is torch.func.vmap is torch._functorch.apis.vmap  # torch's again after the failure
    # the way out it names works
    torch.testing.assert_close(
        torch.func.vmap(thunder_core.jit(lambda r: torch.sin(r) @ w))(x), _vmapped_inside(x, w)
    )


def test_torch_vmap_called_inside_the_jitted_function_is_recorded_as_thunder_core_vmap():
    """``torch.vmap``/``torch.func.vmap`` looked up while capturing (as Hugging Face's mask
    creation does) maps with thunder_core.vmap: eager's values, batched operations in the trace,
    and torch's vmap back in place after the capture."""
    torch_vmap = torch.vmap
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    jfn = thunder_core.jit(_vmapped_inside)
    for rows in (3, 3, 5):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(jfn(x, w), _vmapped_inside(x, w))
    assert torch.vmap is torch_vmap and torch.func.vmap is torch_vmap
    operations = [o.operation for o in thunder_core.explain(jfn).operations]
    assert not any("vmap" in o for o in operations), operations  # sin and matmul batched by rules


def test_torch_vmap_on_another_thread_during_a_capture_is_torchs():
    """Only the capturing thread records: a thread that maps meanwhile runs torch's own vmap
    (which, unlike a recording, accepts a structure of in_dims per leaf)."""
    import threading

    started, release, seen = threading.Event(), threading.Event(), []

    def slow(x):
        started.set()
        release.wait(10)
        return x * 2

    def other():
        started.wait(10)
        pairs = {"a": torch.ones(3, 2), "b": torch.ones(3)}
        seen.append(torch.vmap(lambda p: p["a"].sum() + p["b"], in_dims=({"a": 0, "b": 0},))(pairs))
        release.set()

    thread = threading.Thread(target=other)
    thread.start()
    torch.testing.assert_close(thunder_core.jit(slow)(torch.ones(2)), torch.ones(2) * 2)
    thread.join(10)
    torch.testing.assert_close(seen[0], torch.full((3,), 3.0))


def _disables_grad(x):
    torch.set_grad_enabled(False)
    return x * 2


def test_a_function_that_returns_with_grad_mode_switched_is_refused():
    # A program does not switch its caller's grad mode: the first call disabled it (capture ran
    # the switch), later calls did not, unlike eager
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(CaptureError, match=r"returns with grad mode disabled \(it was grad mode enabled"):
        thunder_core.jit(_disables_grad)(x)
    assert torch.is_grad_enabled()


def _enables_autocast(x):
    torch.set_autocast_enabled("cpu", True)
    return x * 2


def test_a_function_that_returns_with_autocast_switched_names_it():
    with pytest.raises(
        CaptureError, match=r"returns with cpu autocast to bfloat16 \(it was cpu autocast off"
    ):
        thunder_core.jit(_enables_autocast)(torch.randn(3))
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("backend", ["eager", "thunder_core"])
def test_a_torch_compiled_submodule_is_captured_as_written(backend):
    # Dynamo traced the proxies and capture's own mode, and capture blamed a torch.func transform
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
    model[0] = torch.compile(model[0], backend=backend)
    x = torch.randn(3, 4)
    torch.testing.assert_close(thunder_core.jit(model)(x), model(x))
    torch._dynamo.reset()


def test_a_data_dependent_read_inside_a_library_names_the_librarys_line_too():
    # BatchNorm with momentum=None averages with 1 / float(num_batches_tracked): the message named
    # only the user's call
    model = torch.nn.BatchNorm1d(4, momentum=None).train()
    with pytest.raises(DataDependentError, match=r"batchnorm\.py:\d+: `exponential_average_factor") as info:
        thunder_core.jit(model)(torch.randn(8, 4))
    assert "test_capture.py" in str(info.value)
