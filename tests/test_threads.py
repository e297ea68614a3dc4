"""Several threads calling one jitted module or function at once, with shapes that make some
calls compile while others run cached entries: every result (and gradient) equals eager's."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

import thunder_core

DEFAULT_EXECUTORS = ["inductor", "numba", "torch"]
THREADS = 4


def run_in_threads(work) -> list[str]:
    """Run ``work(thread_index, barrier)`` in THREADS threads; the errors they raised."""
    barrier = threading.Barrier(THREADS)
    errors: list[str] = []

    def target(index):
        try:
            work(index, barrier)
        except Exception as error:  # noqa: BLE001  (reported by the test)
            errors.append(f"thread {index}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=target, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return errors


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 8))


@pytest.mark.parametrize("executors", [["torch"], DEFAULT_EXECUTORS], ids=["torch", "default"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_threads_calling_one_jitted_module(executors, grad):
    model = make_model()
    reference = copy.deepcopy(model)
    jmodel = thunder_core.jit(model, executors=executors, recompile_limit=64)

    def work(index, barrier):
        barrier.wait()
        for step in range(6):
            rows = 1 + (index + step) % 4  # threads meet new shapes while others hit cached ones
            x = torch.randn(rows, 8, requires_grad=grad)
            with torch.set_grad_enabled(grad):
                actual, expected = jmodel(x), reference(x)
            torch.testing.assert_close(actual, expected)
            if grad:
                actual_grads = torch.autograd.grad(actual.square().sum(), [x, *model.parameters()])
                expected_grads = torch.autograd.grad(expected.square().sum(), [x, *reference.parameters()])
                for a, e in zip(actual_grads, expected_grads):
                    torch.testing.assert_close(a, e)

    assert run_in_threads(work) == []
    assert thunder_core.cache_info(jmodel).entries >= 2  # size 1, then sizes >= 2 (symbolic or per size)


SCALE = 3.0


def scaled_softmax(x):
    return torch.softmax(x * SCALE, dim=-1)


def test_threads_calling_one_jitted_function():
    jfn = thunder_core.jit(scaled_softmax)

    def work(index, barrier):
        barrier.wait()
        for step in range(8):
            x = torch.randn(2, 3 + (index + step) % 5)
            torch.testing.assert_close(jfn(x), scaled_softmax(x))

    assert run_in_threads(work) == []


def test_threads_calling_one_torch_compiled_module():
    torch._dynamo.reset()
    model = make_model()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunder_core")

    def work(index, barrier):
        barrier.wait()
        for step in range(4):
            x = torch.randn(1 + (index + step) % 3, 8)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), reference(x))

    assert run_in_threads(work) == []


def test_the_original_module_runs_eagerly_in_other_threads_while_one_compiles():
    model = make_model()
    reference = copy.deepcopy(model)
    jmodel = thunder_core.jit(model, recompile_limit=64)

    def work(index, barrier):
        barrier.wait()
        for step in range(6):
            x = torch.randn(1 + (index * 6 + step) % 9, 8)
            fn = jmodel if index % 2 == 0 else model  # half the threads use the module eagerly
            with torch.no_grad():
                torch.testing.assert_close(fn(x), reference(x))
            assert all(type(p) is torch.nn.Parameter for p in model.parameters())

    assert run_in_threads(work) == []


def test_a_dynamo_compile_overlapping_a_capture_on_another_thread_leaves_is_compiling_false():
    """Capture sets ``torch.compiler.is_compiling()`` for the process, as Dynamo's compile
    session does, and Dynamo saves the flag when a session begins and puts it back when it
    ends: a session that began during a capture on another thread and ended after it once left
    the flag True for good, and eager code took its compiled paths from then on (an eager
    ``nn.TransformerEncoder`` its padded path)."""
    import torch._dynamo  # noqa: F401 - Dynamo's session context, as convert_frame enters it

    session_began, capture_ended = threading.Event(), threading.Event()

    def dynamo_compile_session():
        with torch.compiler._compile_session_context():
            session_began.set()
            assert capture_ended.wait(timeout=60)

    def fn(x):
        thread = threading.Thread(target=dynamo_compile_session)
        thread.start()
        assert session_began.wait(timeout=60)  # the session begins while this capture runs
        fn.thread = thread
        return x * 2

    assert not torch.compiler.is_compiling()
    torch.testing.assert_close(thunder_core.jit(fn)(torch.ones(3)), torch.full((3,), 2.0))
    capture_ended.set()
    fn.thread.join(timeout=60)
    assert not torch.compiler.is_compiling()
