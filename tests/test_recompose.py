"""A decomposed operation whose parts all went back to torch runs whole again, and only then:
exactly its parts, in place, with nothing else taken along (an in-place update that follows
it), inner decompositions first."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from thunder_core import FusionExecutor, RegionNotSupported
from thunder_core.capture.capture import capture
from thunder_core.executors import torch_executor
from thunder_core.executors.claiming import assign_executors


class TakesOnly(FusionExecutor):
    """Claims the given prims and gives every region back (as a shape op alone would be)."""

    def __init__(self, *ops):
        super().__init__("takes_only")
        for op in ops:
            self.register_supported(op)

    def compile_region(self, region):
        raise RegionNotSupported("takes_only compiles nothing")


def _run(fn, args, executor):
    trace, _ = capture(fn, args, {}, positional_names=[f"a{i}" for i in range(len(args))])
    program = assign_executors(trace, [executor, torch_executor.executor])
    return program, program.python_callable()(*args)


def _names(program):
    return [b.symbol.name for b in program.bound_symbols if b.symbol.name != "del"]


def test_a_linear_whose_parts_went_back_runs_whole():
    def f(x, w):
        return F.linear(x, w)

    x, w = torch.randn(3, 8), torch.randn(4, 8)
    program, out = _run(f, (x, w), TakesOnly("prims.permute"))
    torch.testing.assert_close(out, f(x, w))
    assert _names(program) == ["linear"]
    (decision,) = [d for d in program.decisions if d.bsym.symbol.name == "linear"]
    assert decision.executor == "torch" and "run whole" in decision.note


def test_an_in_place_update_right_after_the_parts_is_kept():
    def f(x, w):
        y = F.linear(x, w)
        y += 1.0
        return y.add_(x[:, :4])

    x, w = torch.randn(3, 8), torch.randn(4, 8)
    program, out = _run(f, (x, w), TakesOnly("prims.permute"))
    torch.testing.assert_close(out, f(x, w))
    assert "linear" in _names(program)


def test_nested_decompositions_are_put_back_inner_first():
    """``addmm`` decomposes into a matmul and an add (with a broadcast); the broadcast is taken
    and given back, so the inner and then the outer operation run whole."""

    def f(b, x, w):
        return torch.addmm(b, x, w)

    b, x, w = torch.randn(4), torch.randn(3, 5), torch.randn(5, 4)
    program, out = _run(f, (b, x, w), TakesOnly("prims.broadcast_in_dim", "prims.permute"))
    torch.testing.assert_close(out, f(b, x, w))
    assert _names(program) == ["addmm"], _names(program)
