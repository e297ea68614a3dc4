"""The torch.compile front end: ``torch.compile(fn, backend="thunder_core")``.

Programs with graph breaks, training, real models and stale values, against eager; the report
must name every break and split, and thunder_core must have run the parts around each break.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import zlib

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core import ConfigError


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(fn, **options):
    return torch.compile(fn, backend="thunder_core", options=options or None)


def thunder_ran(report_text: str, graph: int) -> bool:
    return f"[graph {graph} submod_" in report_text


def test_registered_by_entry_point_in_a_fresh_interpreter():
    program = (
        "import torch\n"
        "assert 'thunder_core' in torch._dynamo.list_backends(), torch._dynamo.list_backends()\n"
        "f = torch.compile(lambda x: (x.sin() * 2).sum(), backend='thunder_core')\n"
        "x = torch.randn(8)\n"
        "torch.testing.assert_close(f(x), (x.sin() * 2).sum())\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _item_branch(x, w):
    y = (x @ w).relu()
    if y.sum().item() > 0:
        y = y * 2
    return (y.sin() + 1).sum()


def _print(x, w):
    y = torch.tanh(x @ w)
    print("between graphs")
    return (y * y).sum()


def _loop(x, w):
    y = x @ w
    while y.sum() > 0:
        y = y - 1.5
    return (y.exp() * 0.5).sum()


def _library(x, w):
    y = (x @ w).sigmoid()
    salt = zlib.crc32(b"thunder") % 7
    return (y * salt + y.cos()).sum()


def _nonzero(x, w):
    y = x @ w
    picked = y[torch.nonzero(y > 0, as_tuple=True)]
    return (picked.sin().sum() + y.tanh().sum()) * 0.5


@pytest.mark.parametrize("program", [_item_branch, _print, _loop, _library, _nonzero])
def test_graph_breaks_forward_training_and_report(program, capsys):
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    w = torch.randn(4, 4, requires_grad=True)
    expected = program(x, w)
    (expected_grad,) = torch.autograd.grad(expected, w)
    opt = compiled(program)
    actual = opt(x, w)
    (actual_grad,) = torch.autograd.grad(actual, w)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual_grad, expected_grad)
    report = str(thunder_core.explain(opt))
    assert "graph break at" in report and "Dynamo:" in report
    breaks = report.count("graph break at")
    assert breaks >= 1
    assert thunder_ran(report, 0), report  # thunder_core ran the part before the first break
    last = report.count("graph ") and max(i for i in range(10) if f"graph {i} (" in report)
    assert last >= 1 and thunder_ran(report, last), report  # and the part after the last one
    assert thunder_core.last_traces(opt), "the traces of every thunder_core part"
    assert thunder_core.last_backward_traces(opt), "training through thunder_core's autodiff"


@pytest.mark.parametrize("fallback", ["inductor", "eager"])
def test_an_op_without_a_symbol_is_split_off_with_its_reason(fallback):
    def fn(x):
        y = x.sin() * 2
        z = torch.gradient(y, dim=0)[0]
        return (y + z).cos()

    x = torch.randn(5, 3)
    if True:
        opt = compiled(fn, fallback=fallback)
        torch.testing.assert_close(opt(x), fn(x))
        report = str(thunder_core.explain(opt))
        assert "split: gradient (torch.gradient): no thunder_core symbol" in report
        assert f"-> {fallback}" in report
        assert report.count("-> thunder_core") == 2, report  # before and after the split


@pytest.mark.parametrize(
    "transform",
    [
        lambda w: torch.func.vmap(lambda row: torch.sin(row) @ w),
        lambda w: torch.func.vmap(torch.func.grad(lambda row: (torch.sin(row) @ w).sum())),
    ],
    ids=["vmap", "vmap of grad"],
)
def test_a_graph_running_a_torch_func_transform_is_one_fallback_part(transform):
    # Its operations act on the transform's batched tensors: captured apart, they crashed
    def fn(x, w):
        return transform(w)(x) * 2

    x, w = torch.randn(3, 4), torch.randn(4, 2)
    opt = compiled(fn)
    torch.testing.assert_close(opt(x, w), fn(x, w))
    assert "inside the torch.func transform" in str(thunder_core.explain(opt))


def _no_grad_cos_then_product(x, w):
    with torch.no_grad():  # as Hugging Face's rotary embeddings: no_grad around an autocast block
        with torch.autocast("cpu", enabled=False):
            c = x.cos()
    return (x * w * c).sum()


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_no_grad_block_split_across_parts_leaves_grad_mode_as_eager_does(dynamic):
    # The autocast block made a fallback part between the no_grad block's switches, and the
    # parts holding the switches switched grad mode only while captured: from the second call on
    # the caller's grad mode was left disabled (an output without grad_fn, backward impossible)
    x, w = torch.randn(4), torch.randn(4, requires_grad=True)
    (expected,) = torch.autograd.grad(_no_grad_cos_then_product(x, w), w)
    opt = torch.compile(_no_grad_cos_then_product, backend="thunder_core", dynamic=dynamic)
    for _ in range(3):
        out = opt(x, w)
        assert torch.is_grad_enabled() and out.requires_grad
        torch.testing.assert_close(torch.autograd.grad(out, w)[0], expected)
    assert "switches grad mode for the parts after it" in str(thunder_core.explain(opt))


def test_options_select_executors_and_unknown_options_are_errors():
    opt = compiled(lambda x: (x * 2).exp(), executors=["torch"])
    opt(torch.randn(3))
    assert thunder_core.explain(opt).executors == ["torch"]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown torch.compile option") as raised:
        compiled(lambda x: x * 2, executor=["torch"])(torch.randn(3))
    error = raised.value
    while error is not None and not isinstance(error, ConfigError):
        error = error.__cause__ or error.__context__  # Dynamo wraps it in BackendCompilerFailed
    assert isinstance(error, ConfigError)


def test_dynamic_shapes_compile_and_say_so():
    def fn(x):
        return (x.sin() * x.shape[0]).sum(0)

    opt = torch.compile(fn, backend="thunder_core", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 2)
        torch.testing.assert_close(opt(x), fn(x))
    assert "dynamic shapes" in str(thunder_core.explain(opt))


def test_a_split_off_part_serves_every_size_dynamo_lets_through():
    # The Inductor fallback is compiled on Dynamo's symbolic example inputs: compiled on the first
    # call's real tensors instead, it would be handed the next size's tensors with the first's sizes.
    def fn(x):
        return (torch.gcd(x, x + 2) * 2).sum(0) + x.shape[0]

    opt = torch.compile(fn, backend="thunder_core", dynamic=True)
    for n in (4, 6, 9, 5):
        x = torch.randint(0, 50, (n, 3))
        torch.testing.assert_close(opt(x), fn(x))
    report = str(thunder_core.explain(opt))
    assert "gcd (torch.gcd): no thunder_core symbol" in report and "-> inductor" in report


def test_arithmetic_on_symbolic_sizes_stays_in_the_thunder_part():
    # sum() of sizes becomes torch.sym_sum in Dynamo's graph (Hugging Face's attention masks).
    def fn(x, y):
        n = sum([x.shape[0], y.shape[0], 1])
        return (torch.cat([x, y, x[:1]]) * 2).expand(2, n, 3).sum(0)

    opt = torch.compile(fn, backend="thunder_core", dynamic=True)
    for n in (4, 6, 9, 5):
        x, y = torch.randn(n, 3), torch.randn(n + 1, 3)
        torch.testing.assert_close(opt(x, y), fn(x, y))
    report = str(thunder_core.explain(opt))
    assert "-> inductor" not in report and "split:" not in report, report


def _thunder_compiles(opt) -> list[int]:
    from thunder_core.inspection import compile_report

    return [thunder_core.cache_info(part).entries for _, _, part in compile_report(opt).thunder_parts()]


@pytest.mark.parametrize("dynamic", [None, True])
def test_sizes_dynamo_passes_as_ints_are_read_from_the_tensors_and_compile_once_more(dynamic):
    # Dynamo hands a symbolic size over as an int input of its own beside the tensor it came
    # from; keyed as an int, every new size would compile the part again (up to the recompile
    # limit, then eager).
    def fn(x, y):
        n = x.shape[1]
        return (x * 2).softmax(-1) * n + y[:, : n + 1].sum() + x.numel()

    torch._dynamo.reset()
    opt = torch.compile(fn, backend="thunder_core", dynamic=dynamic)
    for length in (8, 16, 24, 32, 40, 48, 56):
        x, y = torch.randn(2, length), torch.randn(2, length + 3)
        torch.testing.assert_close(opt(x, y), fn(x, y))
    compiles = _thunder_compiles(opt)
    assert sum(compiles) <= 3 and max(compiles) <= 2, compiles
    report = str(thunder_core.explain(opt))
    assert "-> inductor" not in report and "split:" not in report, report  # numel stays with thunder_core
    torch._dynamo.reset()


def test_with_dynamic_true_a_part_is_symbolic_where_dynamo_is_and_new_sizes_compile_nothing():
    def fn(x, mask):
        return (x * 2).softmax(-1) * mask.float() + x.shape[1]

    torch._dynamo.reset()
    opt = torch.compile(fn, backend="thunder_core", dynamic=True)
    for length in (8, 13, 21, 34):
        x, mask = torch.randn(2, length), torch.rand(2, length) > 0.5
        torch.testing.assert_close(opt(x, mask), fn(x, mask))
    assert _thunder_compiles(opt) == [1]
    from thunder_core.inspection import compile_report

    (part,) = [part for _, _, part in compile_report(opt).thunder_parts()]
    assert "symbolic sizes" in thunder_core.cache_info(part).reasons[0]
    torch._dynamo.reset()


_VIEWS = {
    "t_": lambda y: y.t_(),
    "unsqueeze_": lambda y: y.unsqueeze_(0),
    "aten.t_": lambda y: torch.ops.aten.t_.default(y),
    "as_strided_": lambda y: torch.as_strided_(y, (y.shape[1], y.shape[0]), (1, y.shape[1])),
}


@pytest.mark.parametrize("view", sorted(_VIEWS))
@pytest.mark.parametrize("dynamic", [None, True])
def test_a_size_read_from_a_tensor_that_a_later_in_place_view_changes_is_checked(dynamic, view):
    # Dynamo's example value of y shows its sizes after y.t_() (or its rank after
    # y.unsqueeze_(0)), in every part: a part would read y.shape[0] from the wrong dimension or
    # make a dimension y does not have symbolic (the int Dynamo passes is compared on every
    # call), and Inductor compiled the parts for those sizes (the change was lost, or a part
    # reading y before it failed Inductor's size checks).
    def fn(x):
        y = x * 2
        w = torch.selu(y) * 3  # no thunder_core symbol: splits the graph; reads y before the view
        z = y.sum(1) * y.shape[0] + w.sum()
        _VIEWS[view](y)
        return z, w, y

    torch._dynamo.reset()
    opt = torch.compile(fn, backend="thunder_core", dynamic=dynamic)
    for shape in ((3, 5), (4, 7), (6, 2), (5, 9)):
        x = torch.randn(shape)
        for got, expected in zip(opt(x), fn(x)):
            torch.testing.assert_close(got, expected)
    torch._dynamo.reset()


class _Norm(torch.nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)
        self.eps = eps  # a float attribute: with dynamic=True Dynamo passes it as a 0-d tensor

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x * 2.5


class _Stack(torch.nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_explain_finds_a_torch_nn_container_compiled_by_the_backend():
    # Dynamo wraps the call of a torch.nn module (Sequential) in a function of its own.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    torch._dynamo.reset()
    opt = torch.compile(model, backend="thunder_core")
    x = torch.randn(3, 4)
    torch.testing.assert_close(opt(x), model(x))
    assert "-> thunder_core" in str(thunder_core.explain(opt))
    assert _thunder_compiles(opt) == [1]
    torch._dynamo.reset()


def test_float_attributes_dynamo_passes_as_tensors_are_read_as_numbers_not_split_off():
    # Dynamo with dynamic=True reads each float attribute with .item() inside its graph; split at
    # every read, a model became a part per layer, and sizes crossing the parts as ints compiled
    # some parts once per size.
    model = _Stack(_Norm(16, 1e-6), torch.nn.Linear(16, 16), _Norm(16, 1e-5))
    torch._dynamo.reset()
    opt = torch.compile(model, backend="thunder_core", dynamic=True)
    for length in (3, 5, 9, 12, 20):
        x = torch.randn(2, length, 16)
        torch.testing.assert_close(opt(x), model(x))
    report = str(thunder_core.explain(opt))
    assert "split:" not in report and "item" not in report, report
    assert _thunder_compiles(opt) == [1]
    model.layers[0].eps = 0.5  # Dynamo passes the new value: the part is keyed on it
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(opt(x), model(x))
    torch._dynamo.reset()


def test_a_size_that_is_a_dimension_plus_a_constant_is_read_from_that_dimension():
    # A mask one longer than the cache: Dynamo's symbol s is the cache's length, the mask's is s + 1.
    def fn(cache, mask):
        n = cache.shape[0]
        return torch.arange(n + 1, dtype=torch.float32) * mask.float() + cache.sum()

    torch._dynamo.reset()
    opt = torch.compile(fn, backend="thunder_core", dynamic=True)
    for length in (5, 9, 12, 20):
        cache, mask = torch.randn(length, 4), torch.rand(length + 1) > 0.5
        torch.testing.assert_close(opt(cache, mask), fn(cache, mask))
    assert sum(_thunder_compiles(opt)) <= 2, _thunder_compiles(opt)
    torch._dynamo.reset()


def test_hf_llama_trains_over_changing_lengths_through_the_backend_with_few_compiles():
    from models import hf_llama, token_batch

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = hf_llama(n_layer=2)
    reference = copy.deepcopy(model)
    opt = torch.compile(model, backend="thunder_core")
    for length in (9, 13, 17, 21):
        idx = token_batch(2, length, seed=length)
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        got = opt(idx, labels=idx).loss
        got.backward()
        expected = reference(idx, labels=idx).loss
        expected.backward()
        torch.testing.assert_close(got, expected)
        for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad, msg=name)
    compiles = _thunder_compiles(opt)
    assert max(compiles) <= 2, compiles
    torch._dynamo.reset()


# The stale-value cases of the trust issue, through Dynamo's guards.
SCALE = 2.0


def test_stale_values_are_seen_through_dynamos_guards():
    global SCALE

    class Configured(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3)
            self.power = 2

        def forward(self, x):
            return self.linear(x) ** self.power * SCALE

    torch.manual_seed(0)
    model = Configured()
    opt = torch.compile(model, backend="thunder_core")
    x = torch.randn(2, 3)
    try:
        torch.testing.assert_close(opt(x), model(x))
        SCALE = 3.0
        torch.testing.assert_close(opt(x), model(x))
        model.power = 3
        torch.testing.assert_close(opt(x), model(x))
        model.eval()
        handle = model.linear.register_forward_hook(lambda m, i, out: out + 1)
        torch.testing.assert_close(opt(x), model(x))
        handle.remove()
    finally:
        SCALE = 2.0


@pytest.mark.slow
def test_litgpt_trains_like_eager_through_the_backend():
    from thunder_core.testing.models import small_litgpt

    torch.manual_seed(0)
    model = small_litgpt(n_layer=2)
    reference = small_litgpt(n_layer=2)
    reference.load_state_dict(model.state_dict())
    opt_model = torch.compile(model, backend="thunder_core")
    idx = torch.randint(0, 128, (2, 17))
    _train_like_eager(opt_model, model, reference, _next_token_loss(idx))


@pytest.mark.slow
def test_hf_llama_trains_like_eager_through_the_backend():
    from models import hf_llama

    torch.manual_seed(0)
    model, reference = hf_llama(), hf_llama()
    reference.load_state_dict(model.state_dict())
    opt_model = torch.compile(model, backend="thunder_core")
    idx = torch.randint(0, model.config.vocab_size, (2, 12))
    _train_like_eager(opt_model, model, reference, lambda m: m(idx, labels=idx).loss)


def _next_token_loss(idx):
    def loss_of(m):
        logits = m(idx[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))

    return loss_of


def _train_like_eager(opt_model, model, reference, loss_of):
    """Three AdamW steps through ``opt_model`` and through ``reference``: same losses and weights."""
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, reference)]
    for _ in range(3):
        losses = []
        for m, o in zip((opt_model, reference), optimizers):
            o.zero_grad()
            loss = loss_of(m)
            loss.backward()
            o.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert thunder_core.last_traces(opt_model) and thunder_core.last_backward_traces(opt_model)


def test_a_jitted_function_called_from_a_torch_compiled_one_runs_its_own_program():
    # torch.compile does not trace into it (it runs thunder-core's compiled program, counted in
    # cache_info) and compiles none of thunder-core's own frames while it runs
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    jfn = thunder_core.jit(lambda x: torch.sin(x) * 2)
    outer = torch.compile(lambda x: jfn(x + 1) - 1, backend="eager")
    for _ in range(3):
        x = torch.randn(4, 4)
        torch.testing.assert_close(outer(x), torch.sin(x + 1) * 2 - 1)
    info = thunder_core.cache_info(jfn)
    assert info.entries == 1 and info.hits + info.misses == 3, info
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["total"] <= 2, dict(frames)  # the lambda and its resume after the call
    torch._dynamo.reset()


def test_hugging_face_generate_that_compiles_the_forward_itself_runs_the_jitted_forward():
    # generate compiles the forward with torch.compile by itself for a static cache on CUDA (here
    # asked for on the CPU); the forward the user jitted must still be what runs
    import warnings

    from models import hf_llama, token_batch
    from transformers import CompileConfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).eval()
    compile_config = CompileConfig()
    compile_config._compile_all_devices = True
    prompt = token_batch(1, 9, seed=1)

    def generate(**kwargs):
        with torch.no_grad():
            return model.generate(
                prompt,
                max_new_tokens=5,
                do_sample=False,
                pad_token_id=0,
                cache_implementation="static",
                **kwargs,
            )

    expected = generate(disable_compile=True)
    model.forward = thunder_core.jit(model.forward)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*runs eagerly, uncompiled")
        assert torch.equal(generate(compile_config=compile_config), expected)
    info = thunder_core.cache_info(model.forward)
    assert info.hits + info.misses == 5 and info.entries <= 3, info
    torch._dynamo.reset()


WINDOW = 8


def _rotate_and_keep_window(x, cos, window):
    batch, length, _ = x.shape
    k = x.view(batch, length, 2, 8).transpose(1, 2)
    k = k * cos + torch.cat([-k[..., 4:], k[..., :4]], -1) * cos  # laid out as the transposed view
    if length > WINDOW:
        window.copy_(k[:, :, -WINDOW:, :])  # a slice of it, given to a part compiled by Inductor
    else:
        window[:, :, :length] = k
    return k.sum(-1)


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_slice_of_a_regions_result_keeps_eagers_strides_for_the_part_after_it(dynamic):
    """A slice is a view: it runs after the region that computes the tensor, so it has eager's
    strides, which the Inductor-compiled part after it asserts (a sliding-window cache write)."""
    torch._dynamo.reset()
    compiled = torch.compile(
        _rotate_and_keep_window, backend="thunder_core", dynamic=dynamic, options={"executors": ["inductor"]}
    )
    for length in (6, 9, 12):
        x, cos = torch.randn(2, length, 16), torch.randn(length, 8)
        window, expected_window = torch.zeros(2, 2, WINDOW, 8), torch.zeros(2, 2, WINDOW, 8)
        torch.testing.assert_close(compiled(x, cos, window), _rotate_and_keep_window(x, cos, expected_window))
        torch.testing.assert_close(window, expected_window)
    torch._dynamo.reset()


def test_a_sliced_result_of_a_jitted_function_has_eagers_strides():
    def last_rows(x, cos):
        k = x.view(2, -1, 2, 8).transpose(1, 2) * cos
        return (k + 1)[:, :, -3:, :], k[..., 1:3]

    x, cos = torch.randn(2, 9, 16), torch.randn(9, 8)
    for got, want in zip(thunder_core.jit(last_rows, executors=["inductor"])(x, cos), last_rows(x, cos)):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_cache_info_of_a_torch_compile_object_adds_up_its_thunder_core_parts():
    def fn(x):
        y = (x.sin() * 2).sum(0)
        print("a graph break")
        return y.cos()

    opt = compiled(fn)
    x = torch.randn(5, 3)
    for _ in range(3):
        torch.testing.assert_close(opt(x), fn(x))
    info = thunder_core.cache_info(opt)
    assert (info.entries, info.misses, info.hits) == (2, 2, 4)  # a part before the break and one after
    assert info.reasons == ("graph 0 submod_0: first call", "graph 1 submod_0: first call")
