"""Regions of a recompiled program compiled at its second call.

A function's later programs are often run once: the first decoding step of a generate (its cache
has just been filled; the next step's longer cache compiles the program with symbolic sizes that
serves every later step), the last, smaller batch of an epoch. Compiling such a program's fusion
regions costs seconds of code generation and C++ builds for kernels that run once. So with the
job's ``recompiled_regions="at_second_call"`` (the default), a program compiled again for a
function with fixed sizes runs its first call with each fusion region's operations run by the
torch executor, and compiles the regions at its second call, on the calling thread, before they
run. What runs is the same on every run of a job: reproducible.

Not deferred: the first program of a function (compiled at once, as ``torch.compile`` does), a
program with symbolic sizes (one compile serves every size; its compile may add size guards,
which must be taken with the program's), regions with effects (in-place updates, random draws),
strict mode (a failure must reach the caller), and programs whose regions compile in the
background (``compile_in_background``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from thunder_core.executors import failures
from thunder_core.executors.background import BackgroundCompile, foreground_compile


class ProgramCalls:
    """How many times a program has been called (``counting`` wraps it). A region runs more than
    once in one call when it belongs to a repeated block (a model's layers), and a backward runs
    after its forward has returned, so the program's calls are counted, not the region's."""

    def __init__(self):
        self.count = 0

    def counting(self, program: Callable) -> Callable:
        def counted(*args):
            self.count += 1
            return program(*args)

        return counted


_at_second_call: contextvars.ContextVar[ProgramCalls | None] = contextvars.ContextVar(
    "thunder_core_regions_at_second_call", default=None
)


@contextmanager
def compiling_at_second_call(calls: ProgramCalls | None) -> Iterator[None]:
    """With ``calls``, the fusion regions of the program compiled in this block compile at its
    second call (``calls`` counts them); with None, at once."""
    token = _at_second_call.set(calls)
    try:
        yield
    finally:
        _at_second_call.reset(token)


def at_second_call() -> ProgramCalls | None:
    """The calls of the program being compiled, if it leaves its fusion regions to its second call."""
    return _at_second_call.get()


class RegionLeftToTorch(Exception):
    """Why a region compiled at its second call keeps its torch operations."""


class SecondCallCompile(BackgroundCompile):
    """A fusion region that runs its torch operations in its program's first call and is compiled
    when it runs in the second, before it runs; a compile or first compiled run that
    fails warns, as at a compile before the program, and leaves the torch operations."""

    def __init__(
        self,
        build: Callable[[], Callable],
        fallback: Callable,
        executor: str,
        inputs,
        bound_symbols,
        calls: ProgramCalls,
    ):
        super().__init__(build, fallback, executor, inputs)
        self._calls = calls
        self._bound_symbols = list(bound_symbols)
        self._options = failures._options.get()  # how failures are reported, from the job
        self.__name__ = f"{executor}_second_call_compile"

    def note(self) -> str:
        if self.state == "compiled":
            return "compiled at its program's second call (the first ran its torch operations)"
        return "compiled at its program's second call: until then torch runs its operations"

    def __call__(self, *args):
        compiled = self._compiled
        if compiled is not None:
            return compiled(*args)
        if self.state == "not started" and self._calls.count > 1:
            with foreground_compile():
                self._compile()
            if self.state == "compiled":
                return self._first_compiled_call(args)
        return self._fallback(*args)

    def _keep_torch(self, reason: str) -> None:
        from thunder_core.executors.fusion import operations

        super()._keep_torch(reason)
        token = failures._options.set(self._options)
        try:
            failures.report_failure(
                self._executor,
                "at a recompiled program's second call",
                operations(self._bound_symbols),
                RegionLeftToTorch(reason),
                self._bound_symbols,
            )
        finally:
            failures._options.reset(token)
