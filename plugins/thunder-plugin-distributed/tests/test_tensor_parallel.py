"""The tensor-parallel plugin on 2 and 4 processes (gloo, CPU): litgpt and Hugging Face Llama
trained for 5 AdamW steps, with and without sequence parallelism, give the losses and parameters
of one eager process over the same batches, with each rank holding its share of the split layers
(and, with sequence parallelism, its part of the activations between the blocks)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
MODELS = ["litgpt"] + (["llama"] if importlib.util.find_spec("transformers") is not None else [])
SCENARIOS = [*MODELS, *(f"{m}_sequence" for m in MODELS)]
# With thunder-plugin-checkpoint installed beside this package: the two plugins together.
if importlib.util.find_spec("thunder_plugin_checkpoint") is not None:
    SCENARIOS.append("litgpt_checkpoint")
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker():
    sys.path.insert(0, str(HERE))
    try:
        import tp_worker
    finally:
        sys.path.remove(str(HERE))
    return tp_worker


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def runs(request, tmp_path_factory) -> tuple[int, dict]:
    ranks = request.param
    out = tmp_path_factory.mktemp(f"tensor_parallel_{ranks}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THUNDER_CORE_NO_AUTOLOAD": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
        str(HERE / "tp_worker.py"), str(out), *SCENARIOS,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"torchrun failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    return ranks, {name: torch.load(out / f"{name}-{ranks}.pt", weights_only=False) for name in SCENARIOS}


@pytest.fixture(scope="module")
def references() -> dict:
    worker = _worker()
    builds = {"litgpt": worker.build_litgpt, "llama": worker.build_llama}
    return {name: worker.reference(builds[name]) for name in MODELS}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_tensor_parallel_training_equals_one_eager_process(runs, references, scenario):
    ranks, results = runs
    result, reference = results[scenario], references[scenario.split("_")[0]]
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(reference["losses"]), **TOLERANCE)
    assert set(result["params"]) == set(reference["params"])
    for name, expected in reference["params"].items():
        torch.testing.assert_close(
            result["params"][name], expected, **TOLERANCE, msg=lambda m, n=name: f"{n}: {m}"
        )
    # One all-reduce after each row-parallel layer in the forward and one before each column-parallel
    # group in the backward: the collectives are in the traces.
    assert result["collectives"]["tp_copy"] > 0 and result["collectives"]["tp_all_reduce"] > 0
    if scenario.endswith("_sequence"):
        assert result["collectives"]["tp_all_gather_sequence"] > 0
        assert result["collectives"]["tp_reduce_scatter_sequence"] > 0


@pytest.mark.parametrize("model", MODELS)
def test_sequence_parallel_blocks_hold_their_part_of_the_sequence(runs, model):
    ranks, results = runs
    whole, split = results[model], results[f"{model}_sequence"]
    length = _worker().LENGTH
    assert [shape[1] for shape in whole["block_inputs"]] == [length]
    assert [shape[1] for shape in split["block_inputs"]] == [length // ranks]  # what the trace takes in
    assert split["saved_by_blocks"] < whole["saved_by_blocks"]  # and what it keeps for the backward


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_rank_holds_its_share_of_the_split_layers(runs, scenario):
    ranks, results = runs
    result = results[scenario]
    assert len(result["local_shapes"]) == ranks
    split = 0
    for name, full in result["full_shapes"].items():
        held = [shapes[name] for shapes in result["local_shapes"]]
        if held[0] != full:
            split += 1
            for local in held:  # every rank the same share: one dimension divided by the ranks
                assert [a * ranks if a != b else a for a, b in zip(local, full)] == list(full), (
                    name,
                    held,
                    full,
                )
    assert split >= 10  # the 5 (litgpt) or 7 (Llama) projections of both layers
    full_elements, local_elements = result["elements"]
    assert full_elements / ranks < local_elements < full_elements  # embeddings, norms and the head are whole


@pytest.mark.skipif("litgpt_checkpoint" not in SCENARIOS, reason="thunder-plugin-checkpoint is not installed")
def test_with_activation_checkpointing_the_blocks_save_less(runs):
    ranks, results = runs
    assert results["litgpt_checkpoint"]["saved_by_blocks"] < results["litgpt"]["saved_by_blocks"]
