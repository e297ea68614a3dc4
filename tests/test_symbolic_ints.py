"""Python ints whose values change between calls: one compile with the int symbolic (a ``SymInt``),
checked against eager PyTorch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from models import greedy_generate, hf_llama, token_batch

import thunder_core


def _head(x, n):
    return x[:n] * 2, n + 1


def test_a_changed_int_compiles_once_more_with_it_symbolic():
    jfn = thunder_core.jit(_head)
    x = torch.randn(16, 3)
    for n in (2, 3, 5, 7, 12, 4):
        out, m = jfn(x, n)
        torch.testing.assert_close(out, x[:n] * 2)
        assert m == n + 1 and type(m) is int  # computed on every call, returned as eager returns it
    info = thunder_core.cache_info(jfn)
    assert info.entries == 2, info.reasons  # the first value, then every other one
    assert info.reasons[1] == "n: int 2 -> int 3; symbolic sizes: int n", info.reasons
    source = str(thunder_core.last_traces(jfn)[-1])
    assert '# n: "int s0"' in source and "s0 = n" in source and "return (t2, 1 + s0)" in source, source


def test_ints_past_the_guards_negative_zero_and_one_give_eagers_results():
    jfn = thunder_core.jit(_head)
    x = torch.randn(8, 3)
    values = (2, 3, 20, 30, 1, 0, -1, -3, 6, 0, 1, -2)
    for n in values:
        out, m = jfn(x, n)
        torch.testing.assert_close(out, x[:n] * 2)
        assert m == n + 1
    info = thunder_core.cache_info(jfn)
    # symbolic up to 8 (x's length), symbolic past it, 0 and 1 fixed, negative symbolic
    assert info.entries <= 6, info.reasons
    assert any(reason.startswith("size guard failed:") for reason in info.reasons), info.reasons


def test_dynamic_false_keeps_ints_fixed():
    jfn = thunder_core.jit(_head, dynamic=False)
    x = torch.randn(8, 3)
    for n in (2, 3, 4):
        torch.testing.assert_close(jfn(x, n)[0], x[:n] * 2)
    assert thunder_core.cache_info(jfn).entries == 3


def _every_third(x, n):
    if n % 3 == 0:
        return x * n
    return x - n


def test_a_branch_on_an_int_gives_eagers_result_on_both_sides_and_names_the_guard():
    jfn = thunder_core.jit(_every_third)
    x = torch.randn(4)
    for n in (2, 4, 5, 6, 9, 7, 12):
        torch.testing.assert_close(jfn(x, n), _every_third(x, n))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 3, info.reasons  # 2; then n % 3 != 0; then n % 3 == 0
    assert info.reasons[2] == "size guard failed: (n % 3) != 0; symbolic sizes: int n", info.reasons


def test_the_size_guard_reading_ints_once_answers_as_torchs_printed_guard():
    def program(x, n, m):
        if n > 4:
            x = x * 2
        return x[: n + m].sum() + m

    jfn = thunder_core.jit(program)
    x = torch.randn(20, 3)
    for n, m in ((2, 3), (6, 5), (7, 9)):
        torch.testing.assert_close(jfn(x, n, m), program(x, n, m))
    guard = thunder_core.inspection._function(jfn)._last.size_guard
    assert guard._reads_once is not None and "L['t1']" in guard.expression, guard.expression
    calls = [[x, n, m] for n in (-3, 0, 1, 2, 5, 9, 30) for m in (-1, 0, 2, 5, 11)]
    calls += [[x, 6.0, 5], [x, True, 5], [x, 6, None], [x[:, :2], 6, 5]]  # not ints; another x
    answers = [(guard(call), guard.evaluate(call)) for call in calls]
    assert all(fast == printed for fast, printed in answers), answers
    assert any(fast for fast, _ in answers) and not all(fast for fast, _ in answers)


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x, n: x * len(f"{n}"), id="formatted"),
        pytest.param(lambda x, n: x * len(str(n)) + len(repr(n)), id="str-repr"),
        pytest.param(lambda x, n: x * {3: 1.0, 5: 2.0, 12: 4.0}.get(n, 0.5), id="dict-key"),
        pytest.param(lambda x, n: sum(x[i] for i in range(n)), id="range"),
        pytest.param(lambda x, n: x + torch.tensor(n), id="tensor-of-it"),
        pytest.param(lambda x, n: x * (1.0 / n), id="float"),
        pytest.param(lambda x, n: torch.stack([c.sum() for c in x.chunk(n)]), id="chunks"),
        pytest.param(lambda x, n: torch.cat([t * 2 for t in x.split(n)]), id="split"),
        pytest.param(lambda x, n: x[slice(-n, None) if isinstance(n, int) else n] * 2, id="isinstance"),
    ],
)
def test_every_use_of_an_int_gives_eagers_result(fn):
    """Uses that need its value (printing it, a dict key, a loop count) specialize the program on
    it; the others stay symbolic (``isinstance(n, int)`` is True, as in eager). Either way each
    call gives eager's result."""
    jfn = thunder_core.jit(fn)
    for n in (3, 5, 12, 10, 2):
        x = torch.randn(12, 3)
        torch.testing.assert_close(jfn(x, n), fn(x, n))


def test_logits_for_a_changing_number_of_positions_are_eagers():
    """Hugging Face's ``logits_to_keep`` (assisted decoding passes a new count each step) is a
    slice of the last positions when it is an int, and an index tensor otherwise."""
    torch.manual_seed(0)
    model = hf_llama(n_layer=1).eval()
    tokens = token_batch(1, 12, seed=7)
    forward = thunder_core.jit(model.forward)
    with torch.no_grad():
        for keep in (2, 3, 5, 4):
            got = forward(tokens, logits_to_keep=keep).logits
            torch.testing.assert_close(got, model(tokens, logits_to_keep=keep).logits)
            assert got.shape == (1, keep, 256)
    info = thunder_core.cache_info(forward)
    assert info.entries == 2 and info.reasons[1].endswith("int logits_to_keep"), info.reasons


@dataclasses.dataclass
class Window:
    """A cache that counts what it has seen, as Hugging Face's sliding-window layers do."""

    keys: torch.Tensor
    seen: int = 0
    size: int = 4


def _append(window: Window, new: torch.Tensor) -> torch.Tensor:
    window.seen += new.shape[0]
    full = torch.cat([window.keys, new])
    window.keys = full[-window.size + 1 :]
    offset = max(window.seen - window.size + 1, 0)
    return full.sum(0) * (offset + 1)


def test_an_int_attribute_the_function_updates_is_seen_by_the_caller():
    jfn = thunder_core.jit(_append)
    eager, compiled = Window(torch.zeros(3, 2)), Window(torch.zeros(3, 2))
    for step in range(10):
        new = torch.full((1, 2), float(step))
        torch.testing.assert_close(jfn(compiled, new), _append(eager, new))
        assert compiled.seen == eager.seen and type(compiled.seen) is int
        torch.testing.assert_close(compiled.keys, eager.keys)
    info = thunder_core.cache_info(jfn)
    assert info.entries <= 3, info.reasons  # not one per step
    assert any("symbolic sizes: int window_seen" in reason for reason in info.reasons), info.reasons


class _Scaled(torch.nn.Module):
    """Holds a window and reads it, besides the one it is given (which may be another)."""

    def __init__(self, window: Window):
        super().__init__()
        self.window = window

    def forward(self, x, window: Window):
        return x * self.window.seen + window.seen


def test_an_argument_object_the_module_also_holds_is_read_as_the_module_holds_it():
    held, other = Window(torch.zeros(1)), Window(torch.zeros(1))
    model = _Scaled(held)
    jitted = thunder_core.jit(model)
    x = torch.randn(3)
    for step in range(2, 9):
        held.seen, other.seen = step, 10 * step
        for given in (held, other, held):
            torch.testing.assert_close(jitted(x, given), model(x, given))


def test_training_with_an_int_argument_gives_eagers_gradients():
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 4)

    def loss(x, n):
        return (linear(x[:n]).relu() * n).sum() + torch.arange(n).sum()

    jfn = thunder_core.jit(loss)
    for n in (2, 3, 5, 7):
        x = torch.randn(16, 3, requires_grad=True)
        jfn(x, n).backward()
        got = x.grad, linear.weight.grad
        x.grad, linear.weight.grad = None, None
        loss(x, n).backward()
        torch.testing.assert_close(got, (x.grad, linear.weight.grad))
        linear.weight.grad, linear.bias.grad = None, None
    info = thunder_core.cache_info(jfn)
    assert info.entries == 2, info.reasons


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_sliding_window_generate_gives_eagers_tokens_without_a_compile_per_token(cache, dynamic):
    """Mistral's sliding-window caches count the tokens seen in an int attribute that grows every
    step; a window shorter than the generated text takes both of its code paths."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, sliding_window=5,
    )  # fmt: skip
    model = MistralForCausalLM(config).eval()
    kwargs = {"min_new_tokens": 6}  # 6 steps past a 4-token prompt
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    prompts = [token_batch(1, 4, seed=3), token_batch(1, 7, seed=4)]
    expected = [greedy_generate(model, prompt, **kwargs) for prompt in prompts]
    model.forward = thunder_core.jit(model.forward, dynamic=dynamic)
    assert torch.equal(greedy_generate(model, prompts[0], **kwargs), expected[0])
    info = thunder_core.cache_info(model.forward)
    assert info.entries <= 3, info.reasons  # prefill, first step, every later step
    assert any("cumulative_length" in reason for reason in info.reasons), info.reasons
    if cache == "dynamic":  # (a static cache is made anew for this prompt: Hugging Face's choice)
        assert torch.equal(greedy_generate(model, prompts[1], **kwargs), expected[1])
        assert thunder_core.cache_info(model.forward).entries <= 4, thunder_core.cache_info(
            model.forward
        ).reasons


def test_an_int_dynamo_made_symbolic_is_symbolic_in_the_parts_first_compile():
    def head(x, n):
        return (x[:n] * 2).sum(0) + n

    compiled = torch.compile(head, backend="thunder_core", dynamic=True)
    x = torch.randn(16, 3)
    for n in (3, 5, 9, 12):
        torch.testing.assert_close(compiled(x, n), head(x, n))
    info = thunder_core.cache_info(compiled)
    assert info.entries == 1 and "int L_n" in info.reasons[0], info.reasons
