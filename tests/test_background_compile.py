"""Compiles in the background: a region runs its torch operations until its compile is done."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import thunder_core
from thunder_core import ConfigError, FusionExecutor, RegionNotSupported
from thunder_core.capture.capture import capture
from thunder_core.capture.symbolic import SymbolicSizes
from thunder_core.executors import background, torch_executor
from thunder_core.executors.background import BackgroundCompile, compiling_in_background
from thunder_core.executors.claiming import assign_executors
from thunder_core.executors.failures import FirstCall
from thunder_core.plugins.config import resolve


class GatedRegions(FusionExecutor):
    """Runs each region as the trace of its operations, compiled only when ``gate`` is set;
    counts the compiled regions' calls and the threads that compiled them."""

    compiles_in_background = True
    takes_symbolic_sizes = True

    def __init__(self, name="gated", fail=None, assume=None):
        super().__init__(name)
        self.gate = threading.Event()
        self.fail = fail
        self.assume = assume  # called with a symbolic size of the region's inputs while compiling
        self.calls = 0
        self.compiled_on: list[str] = []
        self.compiled_at: list[float] = []  # time.monotonic() when each compile began
        for op in ("add", "mul", "exp", "sin"):
            self.register_supported(op)

    def compile_region(self, region):
        assert self.gate.wait(timeout=60)
        self.compiled_at.append(time.monotonic())
        self.compiled_on.append(threading.current_thread().name)
        if self.fail is not None:
            raise self.fail
        if self.assume is not None:
            self.assume(next(s for p in region.inputs for s in p.shape if isinstance(s, torch.SymInt)))
        fn = region.as_trace("region").python_callable()

        def run(*args):
            self.calls += 1
            return fn(*args)

        return run


def f(x):
    return (x.exp() * 2).sin() + x


def _claimed(executor, x, *, background=True, symbolic=None):
    trace, _ = capture(f, (x,), {}, positional_names=["x"], symbolic_sizes=symbolic)
    with compiling_in_background(background):
        return assign_executors(trace, [executor, torch_executor.executor])


def _region(trace):
    (region,) = [b for b in trace.bound_symbols if b.executor != "torch" and b.executor != "python"]
    return _region_impl(region)


def _region_impl(region):
    return region.impl.fn if isinstance(region.impl, FirstCall) else region.impl


def test_a_region_runs_its_torch_operations_until_its_compile_is_done_then_the_compiled_region():
    executor = GatedRegions()
    x = torch.randn(4, 3)
    trace = _claimed(executor, x)
    region = _region(trace)
    assert isinstance(region, BackgroundCompile) and region.state == "not started"
    program = trace.python_callable()
    torch.testing.assert_close(program(x), f(x))  # compile held by the gate: torch ran it
    assert region.state == "compiling" and executor.calls == 0
    torch.testing.assert_close(program(x), f(x))
    assert executor.calls == 0
    executor.gate.set()
    assert thunder_core.wait_for_compiles(timeout=60)
    assert region.done() and executor.compiled_on == ["thunder-core-compile"]
    torch.testing.assert_close(program(x), f(x))
    torch.testing.assert_close(program(x), f(x))
    assert executor.calls == 2  # the compiled region ran, on the main thread's calls


def test_while_a_region_compiles_its_torch_operations_leave_the_worker_a_core():
    # OpenMP threads of the program's operations that waited for a core the worker held made a
    # decoding step take up to a second instead of milliseconds on a 2-core CPU.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        executor = GatedRegions()
        x = torch.randn(4, 3)
        program = _claimed(executor, x).python_callable()
        torch.testing.assert_close(program(x), f(x))  # the compile waits at the gate
        assert torch.get_num_threads() == 2  # lowered only while the region's operations ran
        in_fallback = background._leaving_the_worker_a_core(torch.get_num_threads, ())
        assert in_fallback == 1 and torch.get_num_threads() == 2
        executor.gate.set()
        assert thunder_core.wait_for_compiles(timeout=60)
        assert background._leaving_the_worker_a_core(torch.get_num_threads, ()) == 2  # nothing compiling
        torch.testing.assert_close(program(x), f(x))
        assert executor.calls == 1 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_the_worker_compiles_with_the_intra_op_threads_of_the_program_that_handed_the_compile_over():
    # Inductor writes the compiling thread's count into its kernels: a worker that first computed
    # while a region's operations had lowered the process-wide count would compile for too few.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        background._worker.submit(lambda: torch.set_num_threads(1))  # a worker left on one thread
        assert thunder_core.wait_for_compiles(timeout=60)
        seen = []
        executor = GatedRegions(assume=None)
        executor.gate.set()
        original = executor.compile_region
        executor.compile_region = lambda region: (seen.append(torch.get_num_threads()), original(region))[1]
        x = torch.randn(4, 3)
        program = _claimed(executor, x).python_callable()
        torch.testing.assert_close(program(x), f(x))
        assert thunder_core.wait_for_compiles(timeout=60)
        assert seen == [2]
    finally:
        torch.set_num_threads(threads)


def test_outside_the_background_the_region_is_compiled_before_the_program_runs():
    executor = GatedRegions()
    executor.gate.set()
    x = torch.randn(4, 3)
    trace = _claimed(executor, x, background=False)
    assert not isinstance(_region(trace), BackgroundCompile)
    assert executor.compiled_on == [threading.current_thread().name]
    torch.testing.assert_close(trace.python_callable()(x), f(x))
    assert executor.calls == 1


@pytest.mark.parametrize("error", [RegionNotSupported("not this one"), RuntimeError("compiler crashed")])
def test_a_compile_that_fails_in_the_background_leaves_the_torch_operations(error):
    executor = GatedRegions(fail=error)
    executor.gate.set()
    x = torch.randn(4, 3)
    trace = _claimed(executor, x)
    program = trace.python_callable()
    torch.testing.assert_close(program(x), f(x))
    assert thunder_core.wait_for_compiles(timeout=60)
    torch.testing.assert_close(program(x), f(x))
    region = _region(trace)
    assert region.state.startswith("torch: ") and str(error) in region.failure


def test_a_symbolic_region_whose_compile_assumes_something_about_the_sizes_keeps_its_torch_operations():
    """The program's size guards were taken before the compile: a guard it adds is checked by
    nobody, so the compiled region is not used (sizes below 6 would be wrong for it)."""
    executor = GatedRegions(assume=lambda size: bool(size > 5))
    executor.gate.set()
    x = torch.randn(8, 3)
    sizes = SymbolicSizes({0: frozenset({0})})
    trace = _claimed(executor, x, symbolic=sizes)
    program = trace.python_callable()
    torch.testing.assert_close(program(x), f(x))
    assert thunder_core.wait_for_compiles(timeout=60)
    small = torch.randn(3, 3)
    torch.testing.assert_close(program(small), f(small))
    region = _region(trace)
    assert "assumed something about the symbolic sizes" in region.failure and executor.calls == 0


def test_a_symbolic_region_whose_compile_assumes_nothing_is_used():
    executor = GatedRegions()
    executor.gate.set()
    x = torch.randn(8, 3)
    trace = _claimed(executor, x, symbolic=SymbolicSizes({0: frozenset({0})}))
    program = trace.python_callable()
    program(x)
    assert thunder_core.wait_for_compiles(timeout=60)
    for n in (8, 5, 17):
        y = torch.randn(n, 3)
        torch.testing.assert_close(program(y), f(y))
    assert executor.calls == 3


def _worker_holds_the_lock(executor) -> None:
    """A first program's region compiling on the worker, held there by ``executor``'s gate."""
    x = torch.randn(4, 3)
    _claimed(executor, x).python_callable()(x)
    deadline = time.monotonic() + 60
    while background.COMPILE_LOCK._owner != background._worker.thread.ident:
        assert time.monotonic() < deadline, "the worker never took the lock"
        time.sleep(0.001)


def test_a_region_whose_code_reads_a_size_of_an_input_it_does_not_read_takes_that_input_without_waiting():
    """The region's code reads the size from the program's input that has it (an extra region
    input), so it compiles like any other region: in the background, without waiting for the
    worker's compile, and correct before and after it is swapped in."""
    held, second = GatedRegions("held"), GatedRegions("second")
    second.gate.set()
    _worker_holds_the_lock(held)

    def g(x, y):
        return (x.exp() + y.shape[0]).sin()  # a size of y, which the region's operations do not read

    x, y = torch.randn(5, 3), torch.randn(6, 2)
    sizes = SymbolicSizes({1: frozenset({0})})
    trace, _ = capture(g, (x, y), {}, positional_names=["x", "y"], symbolic_sizes=sizes)
    claimed = []

    def claim():
        with compiling_in_background(True):
            claimed.append(assign_executors(trace, [second, torch_executor.executor]))

    thread = threading.Thread(target=claim)
    thread.start()
    thread.join(timeout=30)
    waited = thread.is_alive()
    (program,) = claimed if not waited else [None]
    if program is not None:  # before the worker compiles it: the region's torch operations
        torch.testing.assert_close(program.python_callable()(x, y), g(x, y))
    held.gate.set()
    thread.join(timeout=60)
    assert thunder_core.wait_for_compiles(timeout=60)
    assert not waited, "claiming waited for the worker's compile"
    (region,) = [b for b in program.bound_symbols if b.executor == "second"]
    assert [p.name for p in region.args] == ["x", "y"]
    for rows in (6, 9):
        y = torch.randn(rows, 2)
        torch.testing.assert_close(program.python_callable()(x, y), g(x, y))


def test_in_a_program_compiled_in_the_background_claims_are_measured_once_the_worker_is_idle():
    """Compiling a claim's alternatives would wait for the worker's compile: until it is done
    the claim runs as made; the call after it measures."""
    from thunder_core.executors.selection import Candidate, Measured

    held = GatedRegions("held")
    _worker_holds_the_lock(held)
    made = []

    def candidate(name, fn):
        return Candidate(name, lambda: made.append(name) or fn)

    with compiling_in_background(True):
        measured = Measured([candidate("claim", torch.exp), candidate("other", torch.exp)], "torch.exp")
    x = torch.randn(16)
    torch.testing.assert_close(measured(x), x.exp())
    assert made == ["claim"] and measured.selection is None
    held.gate.set()
    assert thunder_core.wait_for_compiles(timeout=60)
    torch.testing.assert_close(measured(x), x.exp())
    assert "other" in made and measured.selection is not None


def test_wait_for_compiles_times_out_while_a_compile_runs():
    executor = GatedRegions()
    x = torch.randn(4, 3)
    program = _claimed(executor, x).python_callable()
    program(x)
    assert thunder_core.wait_for_compiles(timeout=0.05) is False
    executor.gate.set()
    assert thunder_core.wait_for_compiles(timeout=60) is True


def test_the_setting_comes_from_the_api_the_environment_or_the_config_file(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert resolve().compile_in_background == "never"
    monkeypatch.setenv("THUNDER_CORE_COMPILE_IN_BACKGROUND", "recompiles")
    assert resolve().compile_in_background == "recompiles"
    assert resolve(compile_in_background="always").compile_in_background == "always"
    monkeypatch.delenv("THUNDER_CORE_COMPILE_IN_BACKGROUND")
    (tmp_path / "pyproject.toml").write_text('[tool.thunder-core]\ncompile_in_background = "always"\n')
    assert resolve().compile_in_background == "always"
    with pytest.raises(ConfigError, match="compile_in_background must be one of"):
        resolve(compile_in_background="later")


class TracingRegions(GatedRegions):
    """Traces each region with FX (as Inductor does) and holds the trace open until ``gate`` is set."""

    def __init__(self):
        super().__init__("tracing")
        self.tracing = threading.Event()

    def compile_region(self, region):
        from torch.fx.experimental.proxy_tensor import make_fx

        fn = region.as_trace("region").python_callable()

        def held(*args):
            self.tracing.set()
            assert self.gate.wait(timeout=60)
            return fn(*args)

        make_fx(held)(*(torch.empty(p.shape, dtype=p.dtype) for p in region.inputs))
        self.compiled_on.append(threading.current_thread().name)
        return super().compile_region(region)


def test_a_function_compiled_by_dynamo_runs_while_a_compile_traces_with_fx_in_the_background():
    """PyTorch's FX tracing flag is one for the process, and Dynamo refuses to run a compiled
    function while it is set: during a compile in the background, such a function runs as it
    is, and compiled again once the compile is done."""
    import torch._dynamo

    executor = TracingRegions()
    x = torch.randn(4, 3)
    program = _claimed(executor, x).python_callable()
    torch.testing.assert_close(program(x), f(x))
    assert executor.tracing.wait(timeout=60)
    assert torch.fx._symbolic_trace.is_fx_tracing()  # the worker is inside its trace now
    frames_before = torch._dynamo.utils.counters["frames"]["ok"]

    def g(y):
        return torch.cos(y) * 3

    y = torch.randn(5)
    try:
        torch.testing.assert_close(torch.compile(g, backend="eager")(y), g(y))
    finally:
        executor.gate.set()
    assert thunder_core.wait_for_compiles(timeout=60)
    assert torch._dynamo.config.error_on_nested_fx_trace  # Dynamo's setting is back
    torch.testing.assert_close(torch.compile(g, backend="eager")(y), g(y))
    assert torch._dynamo.utils.counters["frames"]["ok"] > frames_before  # compiled by Dynamo after
    torch.testing.assert_close(program(x), f(x))
    assert executor.calls == 1 and executor.compiled_on[0] == "thunder-core-compile"


def test_a_compile_on_the_calling_thread_goes_before_the_next_compile_in_the_background():
    """A thread that compiles now waits for its program; the worker's next compile waits for it."""
    order = []
    first, second = GatedRegions("first"), GatedRegions("second")
    second.gate.set()
    second.compile_region = lambda region, run=second.compile_region: (
        order.append("background"),
        run(region),
    )[1]
    _claimed(first, torch.randn(4, 3)).python_callable()(torch.randn(4, 3))  # held on the worker
    _claimed(second, torch.randn(2, 3)).python_callable()(torch.randn(2, 3))  # queued behind it
    deadline = time.monotonic() + 60
    while background.COMPILE_LOCK._owner != background._worker.thread.ident:
        assert time.monotonic() < deadline, "the worker never took the lock"
        time.sleep(0.001)

    def compile_now():
        with background.COMPILE_LOCK:
            order.append("foreground")

    foreground = threading.Thread(target=compile_now)
    foreground.start()
    while background.COMPILE_LOCK._waiting == 0:
        assert time.monotonic() < deadline and foreground.is_alive(), "the foreground thread never waited"
        time.sleep(0.001)
    first.gate.set()
    foreground.join(timeout=60)
    assert thunder_core.wait_for_compiles(timeout=60)
    assert order == ["foreground", "background"]


def test_a_dynamo_compile_waits_for_the_compile_in_the_background_not_beside_it():
    """Dynamo's compile lock is the worker's while it compiles: a frame first called meanwhile
    (not during an FX trace) is compiled by Dynamo after the region's compile, not beside it
    (two FX traces on two threads at once leave ``torch.nn.Module.__call__`` patched)."""
    import torch._dynamo

    executor = GatedRegions()
    x = torch.randn(4, 3)
    program = _claimed(executor, x).python_callable()
    torch.testing.assert_close(program(x), f(x))
    deadline = time.monotonic() + 60
    while background.COMPILE_LOCK._owner != background._worker.thread.ident:
        assert time.monotonic() < deadline, "the worker never took the lock"
        time.sleep(0.001)
    from torch._dynamo.convert_frame import compile_lock

    taken = compile_lock.acquire(blocking=False)
    if taken:
        compile_lock.release()
    assert not taken  # the worker holds Dynamo's compile lock
    order = []

    def g(y):
        order.append("dynamo traces g")
        return torch.cos(y) * 3

    y = torch.randn(5)
    caller = threading.Thread(target=lambda: order.append(torch.compile(g, backend="eager")(y)))
    caller.start()
    time.sleep(0.5)
    assert order == []  # Dynamo waits for its compile lock
    order.append("region compiled")
    executor.gate.set()
    caller.join(timeout=60)
    assert order[:2] == ["region compiled", "dynamo traces g"]
    torch.testing.assert_close(order[2], g(y))
    assert thunder_core.wait_for_compiles(timeout=60)
    assert executor.compiled_on == ["thunder-core-compile"]


def test_a_dynamo_compile_waiting_for_the_worker_goes_before_the_workers_next_compile(monkeypatch):
    """Locks are not handed over in order: the worker pauses after each compile, so a Dynamo
    compile that waited for the worker's first region is not kept waiting for every region."""
    first, second = GatedRegions("first"), GatedRegions("second")
    second.gate.set()
    x = torch.randn(4, 3)
    for executor in (first, second):
        program = _claimed(executor, x).python_callable()
        torch.testing.assert_close(program(x), f(x))  # both regions are handed to the worker
    deadline = time.monotonic() + 60
    while first.compiled_on == [] and background.COMPILE_LOCK._owner != background._worker.thread.ident:
        assert time.monotonic() < deadline, "the worker never took the lock"
        time.sleep(0.001)
    seen = []

    def g(y):
        seen.append(list(second.compiled_on))  # what the worker had compiled when Dynamo traced g
        return torch.cos(y) * 3

    import torch._dynamo.convert_frame as convert_frame

    class Watched:  # Dynamo's compile lock, telling when the caller starts waiting for it
        def __init__(self, lock):
            self.lock, self.waiting = lock, threading.Event()

        def acquire(self, blocking=True, timeout=-1):
            if blocking and threading.current_thread() is caller:
                self.waiting.set()
            return self.lock.acquire(blocking, timeout)

        def release(self):
            self.lock.release()

        def __enter__(self):
            self.acquire()

        def __exit__(self, *exc_info):
            self.release()

    watched = Watched(convert_frame.compile_lock)
    monkeypatch.setattr(convert_frame, "compile_lock", watched)
    y = torch.randn(5)
    results = []
    caller = threading.Thread(target=lambda: results.append(torch.compile(g, backend="eager")(y)))
    caller.start()
    assert watched.waiting.wait(timeout=60)
    time.sleep(0.2)  # inside the lock's acquire, held by the worker
    first.gate.set()
    caller.join(timeout=60)
    assert thunder_core.wait_for_compiles(timeout=60)
    assert seen == [[]]  # Dynamo traced g before the worker's second compile
    assert second.compiled_on == ["thunder-core-compile"]
    torch.testing.assert_close(results[0], g(y))


def test_the_worker_starts_no_compile_while_a_program_compiles_before_it_runs():
    """A program compiling for a caller that waits (capture, transforms: Python) would share the
    interpreter's lock with a compile on the worker: the worker's next compile waits for it."""
    executor = GatedRegions()
    executor.gate.set()
    x = torch.randn(4, 3)
    with background.foreground_compile():
        program = _claimed(executor, x).python_callable()
        torch.testing.assert_close(program(x), f(x))  # its region is handed to the worker
        assert not thunder_core.wait_for_compiles(timeout=2)  # a compile of a few ms: not started
        assert executor.compiled_on == []
    assert thunder_core.wait_for_compiles(timeout=60)
    assert executor.compiled_on == ["thunder-core-compile"]
    waited = executor.compiled_at[0] - background._foreground._last_end
    assert waited >= background._QUIET_S  # nor right after it
    torch.testing.assert_close(program(x), f(x))
    assert executor.calls == 1


def test_a_jitted_function_compiles_its_program_in_the_foreground_and_its_regions_on_the_worker(monkeypatch):
    entered = []
    running = background._foreground.running

    def recording():
        entered.append(threading.current_thread().name)
        return running()

    monkeypatch.setattr(background._foreground, "running", recording)
    jfn = thunder_core.jit(
        f, compile_in_background="always", executors=["inductor", "torch"], select="priority"
    )
    x = torch.randn(4, 3)
    torch.testing.assert_close(jfn(x), f(x))
    assert entered == [threading.current_thread().name]
    regions = [
        _region_impl(b) for b in thunder_core.last_traces(jfn)[-1].bound_symbols if b.executor == "inductor"
    ]
    assert regions and all(isinstance(r, BackgroundCompile) for r in regions)
    assert thunder_core.wait_for_compiles(timeout=300)
    torch.testing.assert_close(jfn(x), f(x))
    assert all(r._compiled is r.compiled for r in regions)  # the compiled regions ran


def test_the_torch_compile_front_end_compiles_in_the_background_when_asked():
    """``options={"compile_in_background": "always"}``: a part runs at once, its Inductor regions
    as torch operations until the worker has compiled them, then compiled."""
    import torch._dynamo

    torch._dynamo.reset()

    def fn(x, w):
        return torch.sin(x @ w * 2) + x.exp().sum(-1, keepdim=True)

    x, w = torch.randn(6, 4), torch.randn(4, 4)
    options = {"compile_in_background": "always", "executors": ["inductor", "torch"], "select": "priority"}
    opt = torch.compile(fn, backend="thunder_core", options=options)
    torch.testing.assert_close(opt(x, w), fn(x, w))
    regions = [
        _region_impl(b) for b in thunder_core.last_traces(opt)[-1].bound_symbols if b.executor == "inductor"
    ]
    assert regions and all(isinstance(r, BackgroundCompile) for r in regions)
    assert thunder_core.wait_for_compiles(timeout=300)
    assert all(r.state == "compiled" for r in regions), [r.state for r in regions]
    torch.testing.assert_close(opt(x, w), fn(x, w))
    torch.testing.assert_close(opt(x, w), fn(x, w))
    assert all(r._compiled is r.compiled for r in regions)  # the compiled regions ran


def test_through_the_front_end_a_frame_dynamo_compiles_again_is_a_recompile():
    """``"recompiles"``: Dynamo hands a frame it compiles again (here, new fixed sizes) over as a
    new graph, a new part; that part's first program compiles in the background."""
    import torch._dynamo

    from thunder_core.inspection import compile_report

    torch._dynamo.reset()

    def fn(x):
        return torch.sin(x * 2) + x.exp()

    options = {
        "compile_in_background": "recompiles",
        "executors": ["inductor", "torch"],
        "select": "priority",
    }
    opt = torch.compile(fn, backend="thunder_core", dynamic=False, options=options)
    a, b = torch.randn(6, 4), torch.randn(3, 5)
    torch.testing.assert_close(opt(a), fn(a))
    torch.testing.assert_close(opt(b), fn(b))
    parts = [part for _, _, part in compile_report(opt).thunder_parts()]
    assert len(parts) == 2
    first, second = (
        [_region_impl(x) for x in thunder_core.last_traces(p)[-1].bound_symbols if x.executor == "inductor"]
        for p in parts
    )
    assert first and not any(isinstance(r, BackgroundCompile) for r in first)  # compiled before it ran
    assert second and all(isinstance(r, BackgroundCompile) for r in second)
    assert thunder_core.wait_for_compiles(timeout=300)
    torch.testing.assert_close(opt(b), fn(b))
    assert all(r.state == "compiled" for r in second)
    torch._dynamo.reset()
