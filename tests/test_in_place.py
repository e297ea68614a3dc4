"""Which in-place updates a fusion region may hold, and when running its operations again is safe
(``thunder_core.executors.in_place``), decided on captured traces of real programs."""

from __future__ import annotations

import pytest
import torch

import thunder_core
from thunder_core.executors.in_place import overwrites, restartable, written_positions


def _captured(fn, *args):
    jfn = thunder_core.jit(fn, executors=["torch"])
    with torch.no_grad():
        jfn(*args)
    return thunder_core.last_traces(jfn)[0]


def write_then_read(buf, x, pos):
    view = buf.view(-1)  # a view made before the write reads nothing
    buf.index_copy_(0, pos, x.sin())
    return buf.sum() + view.sum()


def read_then_write(buf, x, pos):
    before = buf.sum()
    buf.index_copy_(0, pos, x.sin())
    return before + buf.sum()


def write_twice(buf, x, pos):
    buf.index_copy_(0, pos, x.sin())
    buf.index_copy_(0, pos + 1, x.cos())
    return buf.sum()


def accumulate(buf, x, pos):
    buf.add_(x.sin())
    return buf.sum()


def accumulate_index_put(buf, x, pos):
    buf.index_put_((pos,), x.sin()[0], accumulate=True)
    return buf.sum()


def overwrite_index_put(buf, x, pos):
    buf.index_put_((pos,), x.sin()[0])
    return buf.sum()


def write_from_itself(buf, x, pos):
    buf.index_copy_(0, pos, buf[:1] * 2)  # the source reads the tensor written
    return buf.sum()


def write_through_a_view(buf, x, pos):
    buf[1:2].copy_(x.exp())
    return buf.sum()


def write_through_detach_after_reading(buf, x, pos):
    before = buf.sum()
    buf.detach().copy_(x.exp().expand(4, 3))  # detach returns a tensor sharing buf's memory
    return before + buf.sum()


def write_a_new_tensor(buf, x, pos):
    mask = torch.zeros(4, 3)
    mask[1:3] = x.exp()  # a tensor the program made: running again makes it again
    return buf.sum() + mask.sum()


def random_after_write(buf, x, pos):
    buf.index_copy_(0, pos, x.sin())
    return buf.sum() + torch.rand(())


CASES = [
    (write_then_read, True),
    (read_then_write, False),
    (write_twice, False),
    (accumulate, False),
    (accumulate_index_put, False),
    (overwrite_index_put, True),
    (write_from_itself, False),
    (write_through_a_view, True),
    (random_after_write, False),
    (write_through_detach_after_reading, False),
    (write_a_new_tensor, True),
]


@pytest.mark.parametrize(("fn", "expected"), CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_a_region_may_run_again_only_if_it_overwrites_each_tensor_once_before_reading_it(fn, expected):
    trace = _captured(fn, torch.zeros(4, 3), torch.randn(1, 3), torch.tensor([1]))
    assert restartable(trace.bound_symbols) is expected, trace


def test_overwrites_names_the_updates_that_replace_values_without_reading_them():
    names = {}
    for fn in (write_then_read, accumulate, accumulate_index_put, overwrite_index_put, write_through_a_view):
        trace = _captured(fn, torch.zeros(4, 3), torch.randn(1, 3), torch.tensor([1]))
        for b in trace.bound_symbols:
            if "inplace" in b.symbol.tags:
                names[fn.__name__] = overwrites(b)
    assert names == {
        "write_then_read": True,
        "accumulate": False,
        "accumulate_index_put": False,
        "overwrite_index_put": True,
        "write_through_a_view": True,
    }


def test_the_written_inputs_are_found_through_the_views_the_region_makes():
    trace = _captured(write_through_a_view, torch.zeros(4, 3), torch.randn(1, 3), torch.tensor([1]))
    assert written_positions(list(trace.inputs), trace.bound_symbols) == (0,)
    trace = _captured(read_then_write, torch.zeros(4, 3), torch.randn(1, 3), torch.tensor([1]))
    assert written_positions(list(trace.inputs), trace.bound_symbols) == (0,)
    trace = _captured(
        write_through_detach_after_reading, torch.zeros(4, 3), torch.randn(1, 3), torch.tensor([1])
    )
    assert written_positions(list(trace.inputs), trace.bound_symbols) == (
        0,
    )  # detach may return buf's memory
    trace = _captured(lambda a, b: a.sin() + b, torch.zeros(2), torch.zeros(2))
    assert written_positions(list(trace.inputs), trace.bound_symbols) == ()
