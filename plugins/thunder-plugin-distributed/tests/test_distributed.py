"""The ddp and fsdp plugins on 2 processes (gloo, CPU) against a single-process eager run.

One ``torchrun --nproc-per-node 2`` runs every scenario of ``worker.py`` (a small litgpt ``GPT``,
5 AdamW steps on each rank's half of the global batch); each test reads what its scenario wrote
and compares it with eager PyTorch training over the whole global batch in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import thunder_core

HERE = Path(__file__).parent
SCENARIOS = [
    "ddp",
    "ddp_one_per_gradient",
    "ddp_no_sync",
    "ddp_default_executors",
    "fsdp",
    "fsdp_zero2",
    "ddp_wrapper",
    "fully_shard_of_jitted_blocks",
    "jit_of_fully_shard",
    "fsdp_checkpoint",
    "ddp_tied",
    "fsdp_tied",
    "ddp_from_environment",
    "fsdp_clipped",
    "fsdp_default_executors",
]
# With thunder-plugin-checkpoint installed beside this package: the two plugins together.
COMBINED = ["ddp_with_activation_checkpointing", "fsdp_with_activation_checkpointing"]
if importlib.util.find_spec("thunder_plugin_checkpoint") is not None:
    SCENARIOS += COMBINED
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("distributed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THUNDER_CORE_NO_AUTOLOAD": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
        str(HERE / "worker.py"), str(out), *SCENARIOS,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"torchrun failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    return {name: torch.load(out / f"{name}.pt", weights_only=False) for name in SCENARIOS}


def _worker():
    """The scenarios' module, which also computes the single-process references."""
    sys.path.insert(0, str(HERE))
    try:
        import worker
    finally:
        sys.path.remove(str(HERE))
    return worker


@pytest.fixture(scope="module")
def single_process() -> dict:
    worker = _worker()
    return worker.reference()


def _assert_same_training(result: dict, reference: dict) -> None:
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(reference["losses"]), **TOLERANCE)
    assert set(result["params"]) >= set(reference["params"])
    for name, expected in reference["params"].items():
        torch.testing.assert_close(
            result["params"][name], expected, **TOLERANCE, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize(
    "scenario",
    [
        "ddp",
        "ddp_one_per_gradient",
        "ddp_no_sync",
        "ddp_default_executors",
        "fsdp",
        "fsdp_zero2",
        "fsdp_default_executors",
    ],
)
def test_training_on_two_ranks_equals_one_process_over_the_global_batch(runs, single_process, scenario):
    _assert_same_training(runs[scenario], single_process)


@pytest.fixture(scope="module")
def single_process_tied() -> dict:
    worker = _worker()
    return worker.reference_tied()


@pytest.mark.parametrize("scenario", ["ddp_tied", "fsdp_tied"])
def test_shared_frozen_and_scalar_parameters_and_buffers(runs, single_process_tied, scenario):
    result = runs[scenario]
    _assert_same_training(result, single_process_tied)
    assert result["params"]["head.weight"] is not None
    torch.testing.assert_close(result["params"]["head.weight"], result["params"]["embedding.weight"])
    torch.testing.assert_close(result["logits"], single_process_tied["logits"], **TOLERANCE)


def test_fsdp_gradient_clipping_uses_the_norm_of_the_whole_gradient(runs):
    worker = _worker()
    result = runs["fsdp_clipped"]
    assert all(norm > worker.CLIP for norm in result["norms"])  # clipping happened at every step
    _assert_same_training(result, worker.reference(clip=worker.CLIP))


def test_the_plugin_is_chosen_by_the_environment(runs, single_process):
    result = runs["ddp_from_environment"]
    assert result["extensions"] == ["ddp"]
    _assert_same_training(result, single_process)


def test_ddp_results_do_not_depend_on_buckets_or_no_sync(runs):
    for other in ("ddp_one_per_gradient", "ddp_no_sync"):
        torch.testing.assert_close(runs[other]["losses"], runs["ddp"]["losses"], rtol=1e-6, atol=1e-6)
        for name, value in runs["ddp"]["params"].items():
            torch.testing.assert_close(runs[other]["params"][name], value, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scenario", COMBINED)
def test_with_activation_checkpointing(runs, single_process, scenario):
    if scenario not in runs:
        pytest.skip("thunder-plugin-checkpoint is not installed")
    _assert_same_training(runs[scenario], single_process)


def test_pytorch_ddp_around_a_jitted_model(runs, single_process):
    _assert_same_training(runs["ddp_wrapper"], single_process)
    for name, value in runs["ddp"]["params"].items():  # the plugin computes what PyTorch's DDP computes
        torch.testing.assert_close(runs["ddp_wrapper"]["params"][name], value, rtol=1e-6, atol=1e-6)


def test_fully_shard_of_jitted_blocks(runs, single_process):
    result = runs["fully_shard_of_jitted_blocks"]
    _assert_same_training(result, single_process)
    for info in result["cache_info"]:  # each block compiled once, the compiled code ran every step
        assert info.entries == 1 and info.hits >= 4


def test_jit_of_a_fully_shard_model_trains_as_one_process(runs, single_process):
    """FSDP2's DTensor parameters traced: the gathers and reduce-scatters are in the traces, each
    rank holds half of every parameter, the optimizer steps the DTensors."""
    result = runs["jit_of_fully_shard"]
    _assert_same_training(result, single_process)
    assert result["extensions"] == ["dtensor"]  # chosen by jit itself
    assert "fsdp_all_gather_again" in result["collectives"]["forward"]
    assert "fsdp_reduce_scatter_start" in result["collectives"]["backward"]
    held, full = result["parameter_elements"]
    assert held <= full / 2 + 64
    assert result["grad_types"] == {"DTensor"}  # every parameter's gradient, placed as the parameter


def test_checkpoint_saved_and_loaded_into_a_fresh_job_continues_the_same(runs, single_process):
    _assert_same_training(runs["fsdp_checkpoint"], single_process)


@pytest.mark.parametrize("scenario", ["fsdp", "fsdp_zero2"])
def test_fsdp_ranks_hold_half_of_parameters_and_optimizer_state(runs, scenario):
    held, full = runs[scenario]["parameter_elements"]
    padding = 127 * 64 % 2 + 64  # the odd-sized vocabulary rows round up to a multiple of 2 ranks
    assert held <= full / 2 + padding
    assert runs[scenario]["optimizer_elements"] == 2 * held  # AdamW: exp_avg and exp_avg_sq of the shards


def _overlapped(ops: list[str], start: str, wait: str) -> bool:
    """Some start is followed by computation before its wait (collectives interleaved with compute)."""
    bookkeeping = {"del", start, wait}
    pending = False
    for op in ops:
        if op == start:
            pending = True
        elif op == wait:
            pending = False
        elif pending and op not in bookkeeping and not op.startswith(("ddp_", "fsdp_")):
            return True
    return False


def test_backward_collectives_are_async_and_interleaved_with_compute(runs):
    ddp = runs["ddp_one_per_gradient"]["collectives"]
    assert ddp["backward"].count("ddp_all_reduce_start") > 1  # one per gradient, no bucket
    assert _overlapped(ddp["backward_ops"], "ddp_all_reduce_start", "ddp_all_reduce_wait")
    assert "_ddp_all_reduce_start(" in ddp["backward_code"]
    assert ddp["forward"] == []

    for scenario in ("fsdp", "fsdp_zero2"):
        fsdp = runs[scenario]["collectives"]
        assert _overlapped(fsdp["backward_ops"], "fsdp_reduce_scatter_start", "fsdp_reduce_scatter_wait")
        assert (
            fsdp["forward"].count("fsdp_all_gather_start")
            == fsdp["forward"].count("fsdp_all_gather_wait")
            > 0
        )
    # ZeRO-3 gathers the parameters again for the backward; ZeRO-2 kept them from the forward.
    assert "fsdp_all_gather_start" in runs["fsdp"]["collectives"]["backward"]
    assert "fsdp_all_gather_start" not in runs["fsdp_zero2"]["collectives"]["backward"]


def test_bucketed_ddp_issues_fewer_all_reduces(runs):
    assert runs["ddp"]["collectives"]["backward"].count("ddp_all_reduce_start") == 1  # all under 1 MiB
    assert runs["ddp_one_per_gradient"]["collectives"]["backward"].count("ddp_all_reduce_start") > 10


def test_without_a_process_group_the_plugins_are_unavailable_with_the_reason():
    from thunder_core import PluginError

    model = torch.nn.Linear(4, 4)
    for name in ("ddp", "fsdp"):
        with pytest.raises(PluginError, match="no torch.distributed process group is initialized"):
            thunder_core.jit(model, plugins=[name])
    listing = subprocess.run(
        [sys.executable, "-m", "thunder_core", "plugins"], capture_output=True, text=True, check=True
    ).stdout
    rows = [line for line in listing.splitlines() if line.split()[:1] in (["ddp"], ["fsdp"])]
    assert len(rows) == 2 and all("unavailable" in row and "torchrun" in row for row in rows)


def test_the_example_script_runs_under_torchrun_with_the_plugin_from_the_environment():
    example = HERE.parents[2] / "examples" / "train_distributed.py"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "THUNDER_CORE_NO_AUTOLOAD": "1",
        "THUNDER_CORE_PLUGINS": "fsdp",
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(example), "--steps", "2", "--length", "16",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "step 1: loss" in done.stdout
    held = [line for line in done.stdout.splitlines() if "parameters held" in line]
    assert len(held) == 2 and all("plugins ['fsdp']" in line for line in held)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc (Linux)")
def test_a_destroyed_group_is_freed_before_the_interpreter_ends(tmp_path):
    """torch.distributed.nn imported after init keeps the destroyed default group (and gloo's
    threads) alive into interpreter finalization, where a thread can abort the process; the
    plugins' exit hook frees it while the interpreter is whole."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THUNDER_CORE_NO_AUTOLOAD": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(HERE / "teardown_worker.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in range(2):
        threads = json.loads((tmp_path / f"rank{rank}.json").read_text())
        if not threads["after_destroy"]:
            pytest.skip("this torch frees the destroyed group itself: nothing to release")
        assert threads["after_exit_hooks"] == [], threads
