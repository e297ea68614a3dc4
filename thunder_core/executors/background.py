"""Compiles that run beside the program.

A program compiled again for a function it already runs (a new prompt length, a last batch
that is smaller, a cache that now holds tensors: a recompile) need not stall the call that
asked for it. Its fusion regions start as their own operations run by the torch executor,
while the executor that claimed them compiles them on one worker thread; the first call after
a region's compile has finished runs the compiled region. Which compiles go to the background
is the job's ``compile_in_background`` setting: ``"never"`` (the default), ``"recompiles"``
or ``"always"`` (the first program of a function too).

Only executors that declare ``compiles_in_background = True`` are compiled this way, only for
regions without effects (an in-place update, a random draw), and never in strict mode (a
failure must reach the caller). The torch.compile front end takes the same setting
(``options={"compile_in_background": ...}``). A compile starts at the region's first call, after the
program and its guards are complete. Compiles of such executors run one at a time, on either thread,
under ``COMPILE_LOCK``; a thread waiting for it to compile now (a region with effects, a program
compiled in the foreground) goes before the worker's next compile, region by region. A region with symbolic sizes keeps its
torch operations if its compile assumed anything new about the sizes (a guard, a replacement or
a divisibility fact added to the trace's ``ShapeEnv``): the program's size guards were taken
before and would not check it.

PyTorch's FX tracing state is one flag for the whole process, and a function compiled by Dynamo
(``torch.compile``) refuses to run while it is set, as if it were being traced. A compile in the
background traces with FX (``make_fx``, Inductor's pattern passes), so a program that starts
using ``torch.compile`` while one runs would see that refusal: during each compile on the worker
Dynamo is told not to refuse (``torch._dynamo.config.error_on_nested_fx_trace = False``), so a
Dynamo-compiled function called meanwhile runs its Python as it is, with eager PyTorch, and its
compiled code once the compile is done; and the worker holds Dynamo's compile lock, so a Dynamo
compile on another thread waits for it instead of tracing beside it. The worker starts no
compile while a program of ours compiles for a caller that waits (``foreground_compile``).

``wait_for_compiles()`` returns once every compile handed to the worker has finished.
"""

from __future__ import annotations

import atexit
import contextvars
import importlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from thunder_core.executors.regions import RegionNotSupported

_in_background: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "thunder_core_compile_in_background", default=False
)


class _CompileLock:
    """A re-entrant lock that the compile worker takes only while no other thread waits for it.

    A thread that compiles now is waiting for its program; the worker's compiles are for
    programs that already run. Used as ``with COMPILE_LOCK:``.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread holding it, and how many times
        self._depth = 0
        self._waiting = 0  # threads other than the worker waiting for it
        self._condition = threading.Condition()

    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not blocking:
            acquired = self._lock.acquire(blocking=False)
        elif threading.current_thread() is _worker.thread:
            with self._condition:
                self._condition.wait_for(lambda: self._waiting == 0)
            acquired = self._lock.acquire()
        else:
            with self._condition:
                self._waiting += 1
            try:
                acquired = self._lock.acquire()
            finally:
                with self._condition:
                    self._waiting -= 1
                    self._condition.notify_all()
        if acquired:
            self._owner, self._depth = me, 1
        return acquired

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("thunder_core: COMPILE_LOCK released by a thread that does not hold it")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    def __enter__(self) -> _CompileLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


#: Held around every compile of an executor that compiles in the background, on either thread.
COMPILE_LOCK = _CompileLock()


@contextmanager
def compiling_in_background(enabled: bool) -> Iterator[None]:
    """Whether the fusion regions compiled in this block compile on the worker thread."""
    token = _in_background.set(enabled)
    try:
        yield
    finally:
        _in_background.reset(token)


def in_background() -> bool:
    """Whether the program being compiled hands its fusion regions to the worker thread."""
    return _in_background.get()


def on_compile_worker() -> bool:
    """Whether the calling code runs on the compile worker, compiling a region in the background.

    Nothing waits for a compile there, and the region is swapped in for its torch operations
    as soon as ``compile_region`` returns: an executor finishes all of its work on the worker
    rather than leaving any of it to the region's first call, which runs on the caller's thread.
    """
    return threading.current_thread() is _worker.thread


def wants_background(mode: str, compiled_before: bool) -> bool:
    """Whether a compile goes to the background under the job's ``compile_in_background``."""
    return mode == "always" or (mode == "recompiles" and compiled_before)


class _Worker:
    """One daemon thread running compiles in the order they were handed over."""

    def __init__(self):
        self._jobs: deque[Callable[[], None]] = deque()
        self._condition = threading.Condition()
        self._busy = False
        self.thread: threading.Thread | None = None
        self._closing = False
        self._threads = 1  # the intra-op threads of the thread that submitted the last job

    def submit(self, job: Callable[[], None]) -> None:
        threads = torch.get_num_threads()  # the program's, before its regions' operations lower it
        with self._condition:
            if self._closing:
                return
            self._threads = threads
            self._jobs.append(job)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="thunder-core-compile", daemon=True)
                self.thread.start()
            self._condition.notify_all()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._jobs:
                    self._busy = False
                    self._condition.notify_all()
                    self._condition.wait()
                job = self._jobs.popleft()
                self._busy = True
                threads = self._threads
            if torch.get_num_threads() != threads:
                # Inductor writes this thread's count into the kernels it compiles; a thread takes
                # PyTorch's process-wide count when it first computes, which a region's operations
                # may have lowered at that moment (_leaving_the_worker_a_core)
                torch.set_num_threads(threads)
            try:
                job()  # BackgroundCompile keeps its torch operations on any failure of its compile
            except BaseException:  # noqa: BLE001 - the worker outlives any job, or waiting would never end
                pass

    def idle(self) -> bool:
        with self._condition:
            return not self._jobs and not self._busy

    def wait(self, timeout: float | None) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def close(self) -> None:
        """At exit: drop the compiles not started, let the one running finish (bounded)."""
        with self._condition:
            self._closing = True
            self._jobs.clear()
        self.wait(timeout=30.0)


_worker = _Worker()
atexit.register(_worker.close)


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Block until every compile running in the background has finished; False on timeout.

    Programs compiled in the background (``compile_in_background``) run their regions with
    torch until then: call this before timing a steady state.
    """
    return _worker.wait(timeout)


def _leaving_the_worker_a_core(fallback: Callable, args: tuple):
    """``fallback(*args)`` (a region's torch operations) on one intra-op thread less while the
    worker compiles (at least one; the thread's count is restored after).

    Each of those operations runs on ``torch.get_num_threads()`` OpenMP threads, which wait for
    one another at its end; with the worker, and the compiler processes it starts, busy on one of
    the cores, one of them waits to be scheduled, and a decoding step of a few hundred small
    operations took hundreds of times as long (on a 2-core CPU, in about one fresh process in
    two). OpenMP keeps the count per thread: it is set on the thread that runs the operations
    (which also sets PyTorch's process-wide count, read by threads that start meanwhile: the
    worker sets its own before each compile).
    """
    threads = torch.get_num_threads()
    if threads == 1 or _worker.idle():
        return fallback(*args)
    torch.set_num_threads(threads - 1)
    try:
        return fallback(*args)
    finally:
        torch.set_num_threads(threads)


def compiles_pending() -> bool:
    """Whether the worker has compiles running or waiting."""
    return not _worker.idle()


class _ForegroundCompiles:
    """Whether a program is compiling for a caller that waits: one of ours (``foreground_compile``)
    or a Dynamo compile, now or within the last ``_QUIET_S``.

    The worker starts no compile meanwhile: both are mostly Python, and a compile beside it would
    take half its time (one interpreter lock). The quiet time after one ends keeps the worker out
    of the short gaps between the compiles of one call (Dynamo compiles a frame, then its graph's
    first call compiles our program; a generate's prefill runs, then its first decoding step
    compiles).
    """

    def __init__(self):
        self._running = 0
        self._last_end = float("-inf")
        self._condition = threading.Condition()

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._condition:
            self._running += 1
        try:
            yield
        finally:
            self.note_activity(ending=True)

    def note_activity(self, ending: bool = False) -> None:
        """A foreground compile ran until now (``ending``: one of ours that just ended)."""
        with self._condition:
            if ending:
                self._running -= 1
            self._last_end = time.monotonic()
            self._condition.notify_all()

    def quiet(self) -> bool:
        return self._running == 0 and time.monotonic() - self._last_end >= _QUIET_S

    def wait_until_quiet(self, deadline: float) -> None:
        with self._condition:
            while not self.quiet():
                now = time.monotonic()
                if now >= deadline:
                    return
                pause = 0.05 if self._running else _QUIET_S - (now - self._last_end)
                self._condition.wait(min(max(pause, 0.005), deadline - now))


_foreground = _ForegroundCompiles()

#: The longest the worker waits for foreground compiles to finish before starting its next one.
_FOREGROUND_WAIT_S = 60.0
#: How long after a foreground compile the worker still waits before starting one.
_QUIET_S = 0.25
#: How long the worker pauses after each compile, so that a thread waiting for a lock it let go
#: gets it (locks are not handed over in order: the worker would take them again at once).
_HANDOVER_S = 0.01


def foreground_compile():
    """A block in which a caller waits for its program to compile: the worker starts no compile
    meanwhile (it waits up to ``_FOREGROUND_WAIT_S`` per compile; one it started just before
    goes on)."""
    return _foreground.running()


class _BesideDynamo:
    """What a compile on the worker holds, so that Dynamo-compiled functions run beside it and
    Dynamo compiles wait for it.

    Entered once per compile, on the worker (Dynamo was imported on the thread that handed the
    compile over), once no program of ours compiles in the foreground: Dynamo's refusal to run
    a compiled function during an FX trace is turned off for every thread that has not set it
    itself until the compile ends, and Dynamo's compile lock is taken, so that no Dynamo
    compile (whose backend, Inductor, traces with FX) runs beside it: every FX trace patches
    ``torch.nn.Module.__call__`` and sets the tracing flag for the whole process, and puts back
    what it found when it ends, so two traces on two threads whose times overlap leave them
    patched and set. That lock is only tried while ``COMPILE_LOCK`` is held, and both are let go
    while a Dynamo compile holds it, so neither order of taking them can deadlock.
    """

    def __enter__(self) -> None:
        from torch._dynamo.convert_frame import compile_lock

        deadline = time.monotonic() + _FOREGROUND_WAIT_S
        while True:
            _foreground.wait_until_quiet(deadline)
            COMPILE_LOCK.acquire()
            if compile_lock.acquire(blocking=False):
                if _foreground.quiet() or time.monotonic() >= deadline:
                    break
                compile_lock.release()  # a foreground compile began meanwhile: after it
            else:
                _foreground.note_activity()  # a Dynamo compile on another thread: after it, and quiet
            COMPILE_LOCK.release()
            time.sleep(0.005)
        self._dynamo_lock = compile_lock
        try:
            self._refusal = _set_dynamo_refusal(False)
        except BaseException:
            self._release()
            raise

    def __exit__(self, *exc_info) -> None:
        try:
            _set_dynamo_refusal(self._refusal)
        finally:
            self._release()
            time.sleep(_HANDOVER_S)

    def _release(self) -> None:
        self._dynamo_lock.release()
        COMPILE_LOCK.release()


def _set_dynamo_refusal(value: bool) -> bool:
    """Set ``torch._dynamo.config.error_on_nested_fx_trace`` for the whole process; the value it had.

    PyTorch keeps config values per thread (in context variables) in recent releases: there
    the setting's default is changed, which every thread that did not set it reads.
    """
    from torch._dynamo import config

    entry = getattr(config, "_config", {}).get("error_on_nested_fx_trace")
    if entry is not None and hasattr(entry, "default"):
        before, entry.default = entry.default, value
        return before
    before = config.error_on_nested_fx_trace
    config.error_on_nested_fx_trace = value
    return before


def _shape_env_of(inputs) -> object | None:
    for p in inputs:
        for s in (*getattr(p, "shape", ()), *(p.stride() if hasattr(p, "stride") else ())):
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def _assumptions(shape_env) -> tuple:
    """What a compile may add to a ShapeEnv that the program's size guards would have to check."""
    return (
        len(shape_env.guards),
        len(getattr(shape_env, "deferred_runtime_asserts", {}) or {}),
        dict(shape_env.replacements),
        frozenset(getattr(shape_env, "divisible", ())),
    )


class BackgroundCompile:
    """A fusion region compiled on the worker thread: its torch operations until the compile is done.

    ``state`` says where it is: ``"not started"`` (before its first call), ``"compiling"``,
    ``"compiled"``, or ``"torch: <reason>"`` when the compile failed, declined the region, or
    assumed something about symbolic sizes that no guard checks.
    """

    def __init__(self, build: Callable[[], Callable], fallback: Callable, executor: str, inputs):
        self._build = build
        self._fallback = fallback
        self._executor = executor
        self._shape_env = _shape_env_of(inputs)
        self._compiled: Callable | None = None
        self.state = "not started"
        self.failure: str | None = None
        self.__name__ = f"{executor}_background_compile"

    @property
    def compiled(self) -> Callable | None:
        """The executor's compiled region, once its compile has succeeded."""
        return getattr(self, "_ready", None) if self.failure is None else None

    def note(self) -> str:
        """What ``explain`` says of the region's compile."""
        if self.done():
            return "compiled in the background"
        return "compiling in the background: torch runs its operations until then"

    def done(self) -> bool:
        """Whether the compile has finished (compiled, or left to torch)."""
        return self.state == "compiled" or self.state.startswith("torch")

    def __call__(self, *args):
        compiled = self._compiled
        if compiled is not None:
            return compiled(*args)
        if self.state == "not started":
            self.state = "compiling"
            importlib.import_module("torch._dynamo")  # here, not on the worker (Inductor has imported it)
            _worker.submit(self._compile_on_worker)
        elif self.state == "compiled":
            return self._first_compiled_call(args)
        return _leaving_the_worker_a_core(self._fallback, args)

    def _first_compiled_call(self, args):
        try:
            result = self._ready(*args)
        except Exception as error:  # noqa: BLE001 - the region is pure: its torch operations run instead
            self._keep_torch(f"{self._executor} failed on its first run: {type(error).__name__}: {error}")
            return self._fallback(*args)
        self._compiled = self._ready
        return result

    def _compile_on_worker(self) -> None:
        try:
            with _BesideDynamo():
                self._compile()
        except BaseException as error:  # noqa: BLE001 - Dynamo could not be set up: the torch operations stay
            if not self.done():
                self._keep_torch(f"the compile could not start: {type(error).__name__}: {error}")

    def _compile(self) -> None:
        try:
            with COMPILE_LOCK:
                before = None if self._shape_env is None else _assumptions(self._shape_env)
                compiled = self._build()
                if before is not None and _assumptions(self._shape_env) != before:
                    self._keep_torch(
                        f"{self._executor}'s compile assumed something about the symbolic sizes that the "
                        "program's size guards, taken before, do not check"
                    )
                    return
        except RegionNotSupported as reason:
            self._declined(f"{self._executor} could not compile the region: {reason}")
            return
        except Exception as error:  # noqa: BLE001 - a failed compile leaves the torch operations
            self._keep_torch(f"{self._executor} failed compiling a region: {type(error).__name__}: {error}")
            return
        self._ready = compiled
        self.state = "compiled"

    def _declined(self, reason: str) -> None:
        """The executor declined the region (``RegionNotSupported``): torch keeps it."""
        self._keep_torch(reason)

    def _keep_torch(self, reason: str) -> None:
        self.failure = reason
        self.state = f"torch: {reason}"
        self._compiled = self._fallback
