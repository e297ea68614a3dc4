"""Reproducers: a region an executor failed on, written as a script that fails the same way in a
fresh process with only thunder-core and that executor installed; ``save_repro`` on demand."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import pytest
import torch
from plugin_packages import FAILING_OPERATOR, _failing_fusion, install_all, uninstall_all

import thunder_core
from thunder_core.plugins.manager import reset_plugin_manager

WRONG_OPERATOR = """
import torch
from thunder_core.plugins import hookimpl


@hookimpl
def thunder_core_register_executor(register):
    from thunder_core import OperatorExecutor

    executor = OperatorExecutor("wrongmul")
    executor.register_implementation("mul", lambda a, b: torch.mul(a, b) + 1e-3)
    register(executor)
"""

PACKAGES = [
    ("tc-repro-failcompile", "executors", "reprofailcompile", "tc_repro_failcompile",
     {"tc_repro_failcompile/__init__.py": _failing_fusion("reprofailcompile", "compile")}, []),
    ("tc-repro-failrun", "executors", "reprofailrun", "tc_repro_failrun",
     {"tc_repro_failrun/__init__.py": _failing_fusion("reprofailrun", "run")}, []),
    ("tc-repro-failop", "executors", "reprofailop", "tc_repro_failop",
     {"tc_repro_failop/__init__.py": FAILING_OPERATOR.replace('"failop"', '"reprofailop"')}, []),
    ("tc-repro-wrongmul", "executors", "wrongmul", "tc_repro_wrongmul",
     {"tc_repro_wrongmul/__init__.py": WRONG_OPERATOR}, []),
]  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    installed = install_all(tmp_path_factory.mktemp("repro_packages"), PACKAGES)
    reset_plugin_manager()
    yield
    uninstall_all(installed)
    reset_plugin_manager()


@pytest.fixture(autouse=True)
def repro_dir(tmp_path, monkeypatch, installed):
    from thunder_core.executors import failures

    monkeypatch.setattr(failures, "_warned", set())  # each failure warns once per process
    monkeypatch.setenv("THUNDER_CORE_REPRO_DIR", str(tmp_path / "repros"))
    monkeypatch.delenv("THUNDER_CORE_STRICT", raising=False)
    return tmp_path / "repros"


def program(a, b):
    return torch.tanh(a * b + a) * 2


def _reproducer_in(caught) -> str:
    (message,) = [str(w.message) for w in caught if "A reproducer:" in str(w.message)]
    return re.search(r"A reproducer: (\S+\.py)", message).group(1)


def _run(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("executor", "failure"),
    [
        ("reprofailcompile", "RuntimeError: nvrtc: out of registers"),
        ("reprofailop", "RuntimeError: illegal memory access"),
    ],
)
def test_an_executor_failure_writes_a_reproducer_that_fails_the_same_way_in_a_fresh_process(
    executor, failure
):
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    jitted = thunder_core.jit(program, executors=[executor])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(jitted(a, b), program(a, b))  # torch ran the region instead
    path = _reproducer_in(caught)
    source = open(path).read()
    assert f"EXECUTORS = [{executor!r}]" in source and failure in source
    done = _run(path)
    assert done.returncode != 0
    assert "ExecutorFailure" in done.stderr and failure in done.stderr, done.stderr[-2000:]


def test_save_repro_of_a_working_program_runs_and_matches_eager(tmp_path):
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    jitted = thunder_core.jit(program, executors=["torch"])
    jitted(a, b)
    path = thunder_core.save_repro(jitted, tmp_path / "repro.py")
    done = _run(path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the result matches eager PyTorch" in done.stdout


def test_save_repro_names_the_regions_it_knows():
    jitted = thunder_core.jit(program, executors=["torch"])
    jitted(torch.randn(2), torch.randn(2))
    with pytest.raises(
        thunder_core.ReproError, match="no region, operation or trace named 'nope'.*computation.*tanh"
    ):
        thunder_core.save_repro(jitted, "unused.py", region="nope")


def test_reproducers_can_be_turned_off(monkeypatch, repro_dir):
    monkeypatch.setenv("THUNDER_CORE_REPRO_DIR", "off")
    a, b = torch.randn(5), torch.randn(5)
    jitted = thunder_core.jit(lambda a, b: a * b + 1, executors=["reprofailop"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(jitted(a, b), a * b + 1)
    assert any("reprofailop" in str(w.message) for w in caught)
    assert not any("A reproducer" in str(w.message) for w in caught)
    assert not repro_dir.exists()


def test_examine_shows_an_executor_whose_result_differs_from_eager():
    found = thunder_core.examine(
        program, torch.randn(4, 3), torch.randn(4, 3), jit_options={"executors": ["wrongmul"]}
    )
    assert found.executors["wrongmul"] == 2  # a * b and * 2
    assert found.matches_eager is False and "output 0" in found.mismatch
    assert 1e-3 <= found.max_difference <= 3.1e-3  # 2 * tanh(a * b + 1e-3 + a) + 1e-3
    assert "DIFFERS from eager" in str(found)
    assert thunder_core.examine(program, torch.randn(4, 3), torch.randn(4, 3)).matches_eager


def test_profiler_ranges_name_torch_once_a_region_fell_back_to_it():
    from torch.profiler import profile

    a, b = torch.randn(4, 3), torch.randn(4, 3)
    jitted = thunder_core.jit(program, executors=["reprofailrun"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile() as first:  # the program with ranges is built before the region's first run
            torch.testing.assert_close(jitted(a, b), program(a, b))
        with profile() as second:
            torch.testing.assert_close(jitted(a, b), program(a, b))
    assert any(e.name.endswith("[reprofailrun]") for e in first.events())
    names = {e.name for e in second.events() if e.name.startswith("thunder_core/computation/")}
    assert names and not any(n.endswith("[reprofailrun]") for n in names)
    assert any("fusion" in n and n.endswith("[torch]") for n in names)


def test_save_repro_of_a_model_with_repeated_blocks_names_its_traces(tmp_path):
    from models import litgpt_gpt, token_batch

    jitted = thunder_core.jit(litgpt_gpt(n_layer=2), executors=["torch"])
    jitted(token_batch(2, 8)).mean().backward()
    with pytest.raises(thunder_core.ReproError, match="programs of repeated blocks.*block_1_forward"):
        thunder_core.save_repro(jitted, tmp_path / "whole.py")
    path = thunder_core.save_repro(jitted, tmp_path / "block.py", region="block_1_backward")
    done = _run(path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the result matches eager PyTorch" in done.stdout
