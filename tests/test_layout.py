"""Memory layout: strides are part of what a trace is specialized on (the cache key), so a
program that branches on ``is_contiguous()`` or passes ``stride()`` on gets eager's result for
every layout of the same shape; executors' checker verdicts are cached per layout too. Where the
data lies in its storage (``storage_offset``, ``data_ptr``) is refused while capturing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import thunder_core
from thunder_core.errors import CaptureError
from thunder_core.executors.base import OperatorExecutor, Rejection

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]
FRONT_ENDS = ["jit-torch", "jit-default", "torch.compile"]


def compiled(fn, front_end):
    if front_end == "torch.compile":
        torch._dynamo.reset()
        return torch.compile(fn, backend="thunder_core")
    return thunder_core.jit(fn, executors=["torch"] if front_end == "jit-torch" else DEFAULT_EXECUTORS)


def layouts():
    """One 4x4 matrix in four layouts of the same shape, dtype and device."""
    base = torch.arange(32.0).reshape(4, 8)
    return {
        "contiguous": base[:, :4].contiguous(),
        "transposed": base[:, :4].contiguous().t(),
        "column slice": base[:, 2:6],
        "strided rows": torch.arange(64.0).reshape(8, 8)[::2, ::2],
    }


def branch_on_contiguity(x):
    return x * 2 if x.is_contiguous() else x * 3


def pass_the_strides_on(x):
    return torch.as_strided(x, (2, 2), x.stride()) + 1


def branch_on_strides(x):
    return x.sum(0) if x.stride(0) > x.stride(1) else x.sum(1)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize(
    "fn", [branch_on_contiguity, pass_the_strides_on, branch_on_strides], ids=lambda f: f.__name__
)
def test_each_layout_gives_eager_result(fn, front_end):
    jfn = compiled(fn, front_end)
    for _ in range(2):  # the second round runs cached entries
        for name, x in layouts().items():
            torch.testing.assert_close(jfn(x), fn(x), msg=name)


def test_the_recompile_reason_names_the_strides():
    jfn = thunder_core.jit(branch_on_contiguity)
    x = torch.randn(3, 3)
    jfn(x)
    jfn(x.t())
    assert "strides (3, 1)" in thunder_core.cache_info(jfn).reasons[-1]
    assert thunder_core.cache_info(jfn).entries == 2


class TransposedBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(4, 4))

    def forward(self, x):
        table = self.table if self.table.is_contiguous() else self.table * 10
        return x @ table


@pytest.mark.parametrize("executors", [["torch"], DEFAULT_EXECUTORS], ids=["torch", "default"])
def test_a_buffer_replaced_by_another_layout_recompiles(executors):
    model = TransposedBuffer()
    jmodel = thunder_core.jit(model, executors=executors)
    x = torch.randn(2, 4)
    torch.testing.assert_close(jmodel(x), model(x))
    model.table = model.table.t()
    torch.testing.assert_close(jmodel(x), model(x))


def test_checker_verdicts_are_cached_per_layout():
    contiguous_only = OperatorExecutor("contiguous_only")
    contiguous_only.register_implementation(
        torch.sin,
        torch.sin,
        checker=lambda x: True if x.is_contiguous() else Rejection("needs a contiguous input"),
    )
    traced = thunder_core.jit(torch.sin)
    verdicts = []
    for x in (torch.randn(3, 3), torch.randn(3, 3).t()):
        traced(x)
        (bsym,) = [b for b in thunder_core.last_traces(traced)[0].bound_symbols if b.symbol.name == "sin"]
        verdicts.append(contiguous_only.check(bsym))
    assert verdicts[0] is True
    assert isinstance(verdicts[1], Rejection) and "contiguous" in str(verdicts[1])


@pytest.mark.parametrize(
    "read", [lambda x: x.storage_offset(), lambda x: x.data_ptr()], ids=["storage_offset", "data_ptr"]
)
def test_reading_where_the_data_lies_is_refused(read):
    def fn(x):
        return x + read(x)

    with pytest.raises(CaptureError, match="where the data lies"):
        thunder_core.jit(fn)(torch.randn(4))
