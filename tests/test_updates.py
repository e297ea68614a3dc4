"""Which tensors a trace updates in place: what an in-place op writes, not what it only reads."""

from __future__ import annotations

import torch

import thunder_core
from thunder_core.transforms.updates import updated_in_place


def _captured(fn, *args):
    jfn = thunder_core.jit(fn, executors=["torch"])
    with torch.no_grad():
        result = jfn(*args)
    return thunder_core.last_traces(jfn)[0], result


def _names_of(trace, *inputs: int) -> set[str]:
    return {trace.inputs[i].name for i in inputs}


def test_the_source_of_an_index_copy_is_only_read():
    def write_entry(cache, x, position):
        window = cache[:1]
        entry = x.sin()
        window.index_copy_(1, position, entry)
        return entry.cos()

    cache, x, position = torch.zeros(2, 8, 4), torch.randn(1, 1, 4), torch.tensor([3])
    expected_cache = cache.clone()
    expected = write_entry(expected_cache, x, position)
    trace, result = _captured(write_entry, cache, x, position)
    torch.testing.assert_close(result, expected)
    torch.testing.assert_close(cache, expected_cache)
    updated = updated_in_place(trace.bound_symbols)
    assert _names_of(trace, 0) <= updated  # the cache, through its view
    window = next(b for b in trace.bound_symbols if b.symbol.name == "getitem").output
    assert window.name in updated
    entry = next(b for b in trace.bound_symbols if b.symbol.name == "sin").output
    assert not (_names_of(trace, 1, 2) | {entry.name}) & updated


def test_an_out_argument_is_what_is_written():
    def add_into(a, b, c):
        torch.add(a, b, out=c)
        return c * 2

    a, b = torch.randn(3), torch.randn(3)
    c, expected_c = torch.zeros(3), torch.zeros(3)
    expected = add_into(a, b, expected_c)
    trace, result = _captured(add_into, a, b, c)
    torch.testing.assert_close(result, expected)
    torch.testing.assert_close(c, expected_c)
    updated = updated_in_place(trace.bound_symbols)
    assert _names_of(trace, 2) <= updated and not _names_of(trace, 0, 1) & updated


@torch.library.custom_op("thunder_core_tests::accumulate_and_double", mutates_args=("total",))
def accumulate_and_double(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    total.add_(x)
    return x * 2


@accumulate_and_double.register_fake
def _(x, total):
    return torch.empty_like(x)


def test_a_custom_ops_schema_says_which_argument_is_written():
    def step(x, total):
        return accumulate_and_double(x.exp(), total) + 1

    x, total, expected_total = torch.randn(4), torch.zeros(4), torch.zeros(4)
    expected = step(x, expected_total)
    trace, result = _captured(step, x, total)
    torch.testing.assert_close(result, expected)
    torch.testing.assert_close(total, expected_total)
    updated = updated_in_place(trace.bound_symbols)
    assert _names_of(trace, 1) <= updated and not _names_of(trace, 0) & updated
    exp = next(b for b in trace.bound_symbols if b.symbol.name == "exp").output
    assert exp.name not in updated


def test_every_tensor_of_a_foreach_list_is_written():
    def scale_both(a, b, c):
        torch._foreach_mul_([a, b], 2.0)
        return a + b + c

    inputs = [torch.ones(3), torch.ones(3), torch.ones(3)]
    expected_inputs = [x.clone() for x in inputs]
    expected = scale_both(*expected_inputs)
    trace, result = _captured(scale_both, *inputs)
    torch.testing.assert_close(result, expected)
    torch.testing.assert_close(inputs, expected_inputs)
    updated = updated_in_place(trace.bound_symbols)
    assert _names_of(trace, 0, 1) <= updated and not _names_of(trace, 2) & updated
