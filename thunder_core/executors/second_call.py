"""Regions of a recompiled program compiled at its second call.

A function's later programs are often run once: the first decoding step of a generate (its cache
has just been filled; the next step's longer cache compiles the program with symbolic sizes that
serves every later step), the last, smaller batch of an epoch. Compiling such a program's fusion
regions costs seconds of code generation and C++ builds for kernels that run once. So with the
job's ``recompiled_regions="at_second_call"`` (the default), a program compiled again for a
function with fixed sizes runs its first call with each fusion region's operations run by the
torch executor, and compiles the regions when it is called a second time, on the calling thread,
before the program runs. What runs is the same on every run of a job (the first call's results
are rounded as torch's kernels round them, later calls' as the compiled region's).

Not deferred: the first program of a function (compiled at once, as ``torch.compile`` does), a
program with symbolic sizes (one compile serves every size; its compile may add size guards,
which must be taken with the program's), regions with effects (in-place updates, random draws),
strict mode (a failure must reach the caller), jobs with an ``after_executors`` pass (CUDA graphs
would keep what the first call ran), and programs compiled with ``compile_in_background`` set
to ``"recompiles"`` or ``"always"``, which decides for them.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from thunder_core.executors import failures
from thunder_core.executors.background import BackgroundCompile, foreground_compile
from thunder_core.transforms.autocast import DEVICE_TYPES, autocast_disabled


class ProgramCalls:
    """A program's calls: ``counting`` wraps the program, and before its second call runs, the
    regions left for it (``pending``, forward and backward) are compiled, on the calling thread.
    A region runs more than once in one call when it belongs to a repeated block (a model's
    layers), and a backward runs after its forward has returned, so the program's calls are
    counted, not the regions' runs; and no region compiles in the middle of the program (inside
    autograd's backward, or a CUDA graph's capture)."""

    def __init__(self, progress: Callable[[], AbstractContextManager] = nullcontext):
        self.count = 0
        self.pending: list[SecondCallCompile] = []
        self._lock = threading.Lock()
        self._progress = progress  # the job's display of a long compile (thunder_core.progress)

    def counting(self, program: Callable) -> Callable:
        def counted(*args):
            if self.pending and self._second_call_or_later():
                self.compile_pending()
            return program(*args)

        return counted

    def _second_call_or_later(self) -> bool:
        if self.count < 2:
            with self._lock:
                self.count += 1
        return self.count >= 2

    def compile_pending(self) -> None:
        """Compile the regions left for this call, each once; one whose compile is interrupted
        (``KeyboardInterrupt``) stays pending for the next call. Not while a CUDA stream is
        being captured into a graph: the next call compiles them."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        # The program holds autocast's casts (capture recorded them): a region compiled under
        # the caller's autocast would have Inductor cast it again.
        with self._progress(), foreground_compile(), autocast_disabled(DEVICE_TYPES):
            for region in list(self.pending):
                region.compile()
                with self._lock:
                    if region in self.pending:
                        self.pending.remove(region)


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
    before the second (``ProgramCalls.compile_pending``). A compile that fails, or a first
    compiled run that fails, warns as at a compile before the program would, and leaves the
    torch operations; a region its executor declines keeps them without a warning."""

    def __init__(
        self,
        build: Callable[[], Callable],
        fallback: Callable,
        executor: str,
        inputs,
        bound_symbols,
        operations: str,
        calls: ProgramCalls,
    ):
        super().__init__(build, fallback, executor, inputs)
        self._calls = calls
        self._bound_symbols = list(bound_symbols)
        self._operations = operations  # for messages
        self._lock = threading.Lock()
        calls.pending.append(self)
        self._options = failures._options.get()  # how failures are reported, from the job
        self.__name__ = f"{executor}_second_call_compile"

    def __getattr__(self, name: str):
        """The compiled region's own attributes (its generated ``source``), once compiled."""
        ready = self.__dict__.get("_ready")
        if ready is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(ready, name)

    def note(self) -> str:
        if self.state == "compiled":
            return "compiled before its program's second call (the first ran its torch operations)"
        return "compiled before its program's second call: until then torch runs its operations"

    def __call__(self, *args):
        compiled = self._compiled
        if compiled is not None:
            return compiled(*args)
        if self.state == "compiled":
            with self._lock:
                if self._compiled is None:
                    return self._first_compiled_call(args)
            return self._compiled(*args)
        return self._fallback(*args)

    def compile(self) -> None:
        """Compile the region now (once, whichever thread asks first)."""
        with self._lock:
            if self.state == "not started":
                self._compile()

    def _declined(self, reason: str) -> None:
        super()._keep_torch(reason)  # as at once, where the next executor would get it: no warning

    def _keep_torch(self, reason: str) -> None:
        super()._keep_torch(reason)
        token = failures._options.set(self._options)
        try:
            failures.report_failure(
                self._executor,
                "at a recompiled program's second call",
                self._operations,
                RegionLeftToTorch(reason),
                self._bound_symbols,
            )
        finally:
            failures._options.reset(token)
