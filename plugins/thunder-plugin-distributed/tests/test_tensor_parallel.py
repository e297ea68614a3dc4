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
#: PyTorch's parallelize_module, then thunder_core.jit (the dtensor plugin).
PARALLELIZED = [f"{m}_parallelize_module" for m in MODELS]
#: PyTorch's FSDP2 (fully_shard), then thunder_core.jit (the dtensor plugin).
FULLY_SHARDED = [f"{m}_fully_shard" for m in MODELS]
SCENARIOS += [*PARALLELIZED, *FULLY_SHARDED, "parallelize_module_refused", "stacks_refused"]
#: On 4 ranks also a (2, 2) mesh: tensor-parallel over pairs of ranks, fsdp or ddp across them.
MESH_2D = [f"{m}_fsdp_2d" for m in MODELS] + ["litgpt_ddp_2d", "litgpt_sequence_fsdp_2d"]
#: On 4 ranks: a checkpoint saved on the 2 x 2 mesh, loaded under tensor-parallel over 4 ranks.
LAYOUTS_2D = ["dcp_2d_to_tensor_parallel"]
if "llama" in MODELS:  # the user's own 2-D DeviceMesh, given as the option mesh
    MESH_2D.append("llama_fsdp_2d_given_mesh")
#: On 2 ranks: a checkpoint saved under tensor-parallel, loaded under fsdp (and by one process).
LAYOUTS = ["dcp_to_fsdp"]
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _scenarios(ranks: int) -> list[str]:
    return [*SCENARIOS, *(MESH_2D + LAYOUTS_2D if ranks == 4 else LAYOUTS)]


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
        str(HERE / "tp_worker.py"), str(out), *_scenarios(ranks),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"torchrun failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    results = {name: torch.load(out / f"{name}-{ranks}.pt", weights_only=False) for name in _scenarios(ranks)}
    results["out"] = out
    return ranks, results


@pytest.fixture(scope="module")
def references() -> dict:
    worker = _worker()
    builds = {"litgpt": worker.build_litgpt, "llama": worker.build_llama}
    return {name: worker.reference(builds[name]) for name in MODELS}


TRAINED = [s for s in SCENARIOS if s not in PARALLELIZED + FULLY_SHARDED and not s.endswith("_refused")]


@pytest.mark.parametrize("scenario", [*TRAINED, *MESH_2D, *LAYOUTS, *LAYOUTS_2D])
def test_tensor_parallel_training_equals_one_eager_process(runs, references, scenario):
    ranks, results = runs
    if scenario not in results:
        pytest.skip(f"{scenario} runs on {2 if scenario in LAYOUTS else 4} ranks")
    if scenario in LAYOUTS + LAYOUTS_2D:
        result, reference = results[scenario], references["litgpt"]
        torch.testing.assert_close(
            torch.tensor(result["losses"]), torch.tensor(reference["losses"]), **TOLERANCE
        )
        _assert_same_parameters(result["params"], reference["params"])
        return
    result, reference = results[scenario], references[scenario.split("_")[0]]
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(reference["losses"]), **TOLERANCE)
    _assert_same_parameters(result["params"], reference["params"])
    # One all-reduce after each row-parallel layer in the forward and one before each column-parallel
    # group in the backward: the collectives are in the traces.
    assert result["collectives"]["tp_copy"] > 0
    assert result["collectives"]["tp_all_reduce"] + result["collectives"]["tp_all_reduce_start"] > 0
    if scenario.endswith("_sequence"):
        assert result["collectives"]["tp_all_gather_sequence"] > 0
        assert result["collectives"]["tp_reduce_scatter_sequence"] > 0


def _assert_same_parameters(params: dict, expected: dict) -> None:
    assert set(params) == set(expected)
    for name, value in expected.items():
        assert not hasattr(params[name], "placements"), f"{name}: a DTensor, not the full tensor"
        torch.testing.assert_close(params[name], value, **TOLERANCE, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("model", MODELS)
def test_sequence_parallel_blocks_hold_their_part_of_the_sequence(runs, model):
    ranks, results = runs
    whole, split = results[model], results[f"{model}_sequence"]
    length = _worker().LENGTH
    assert [shape[1] for shape in whole["block_inputs"]] == [length]
    assert [shape[1] for shape in split["block_inputs"]] == [length // ranks]  # what the trace takes in
    assert split["saved_by_blocks"] < whole["saved_by_blocks"]  # and what it keeps for the backward


@pytest.mark.parametrize("scenario", PARALLELIZED)
def test_jit_of_a_parallelize_module_model_trains_as_one_process(runs, references, scenario):
    """PyTorch's ColwiseParallel/RowwiseParallel layers, traced by the dtensor plugin (chosen by
    jit itself): eager's losses and parameters, the collectives in the traces, each rank holding
    its part of the split weights."""
    ranks, results = runs
    result, reference = results[scenario], references[scenario.split("_")[0]]
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(reference["losses"]), **TOLERANCE)
    _assert_same_parameters(result["params"], reference["params"])
    assert result["extensions"] == ["dtensor"]
    assert result["collectives"]["tp_copy"] > 0
    assert result["collectives"]["tp_all_reduce"] + result["collectives"]["tp_all_reduce_start"] > 0
    split = [name for name, full in result["full_shapes"].items() if result["local_shapes"][0][name] != full]
    assert len(split) >= 6  # litgpt's 3 MLP layers or Llama's 7 projections, in both blocks
    for name in split:
        for shapes in result["local_shapes"]:
            local, full = shapes[name], result["full_shapes"][name]
            assert sorted(a * ranks if a != b else a for a, b in zip(local, full)) == sorted(full)


@pytest.mark.parametrize("model", MODELS)
def test_all_reduces_are_started_early_and_overlap_the_backward(runs, model):
    """In each block's backward, the sum of an input gradient over the group is issued as soon as
    it exists and waited where it is first needed, with compute in between."""
    ranks, results = runs
    for ops in results[model]["block_backward_ops"]:
        assert "tp_all_reduce" not in ops  # every one split into start and wait
        pending, overlapped = False, False
        for op in ops:
            if op == "tp_all_reduce_start":
                pending = True
            elif op == "tp_all_reduce_wait":
                pending = False
            elif pending and op not in ("del", "tp_all_reduce_start"):  # compute while the sum travels
                overlapped = True
        assert ops.count("tp_all_reduce_start") >= 2 and overlapped, ops


@pytest.mark.parametrize("scenario", FULLY_SHARDED)
def test_jit_of_a_fully_shard_model_trains_as_one_process(runs, references, scenario):
    """FSDP2's DTensor parameters traced by the dtensor plugin: eager's losses and parameters,
    the gathers in the traces, each rank holding 1/N of every parameter (padding aside)."""
    ranks, results = runs
    result, reference = results[scenario], references[scenario.split("_")[0]]
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(reference["losses"]), **TOLERANCE)
    _assert_same_parameters(result["params"], reference["params"])
    assert result["extensions"] == ["dtensor"]
    assert result["collectives"]["fsdp_all_gather_again"] > 0
    for name, full in result["full_shapes"].items():
        for shapes in result["local_shapes"]:
            assert shapes[name][1:] == full[1:] and shapes[name][0] <= -(-full[0] // ranks), (
                name,
                shapes[name],
            )


def test_plugin_stacks_that_cannot_work_are_refused_clearly(runs, references):
    ranks, results = runs
    errors = results["stacks_refused"]
    assert "list 'tensor-parallel' before 'fsdp'" in errors["fsdp_first"]
    assert "option size" in errors["no_data_dimension"]
    assert "size=3 does not divide" in errors["size_not_dividing"]
    assert "add 'fsdp' or 'ddp'" in errors["size_alone"]
    # The refused model was left as it was: jitted again, it trains as one eager process.
    torch.testing.assert_close(
        torch.tensor(errors["retried_losses"]), torch.tensor(references["litgpt"]["losses"][:1]), **TOLERANCE
    )


def test_a_checkpoint_of_the_2d_mesh_holds_both_dimensions(runs):
    ranks, results = runs
    if ranks != 4:
        pytest.skip("the 2-D mesh runs on 4 ranks")
    placements = results["dcp_2d_to_tensor_parallel"]["placements"]
    assert (
        placements["transformer.h.0.mlp.fc_1.weight"] == "(Shard(dim=0), Shard(dim=0))"
    )  # tensor, then data
    assert placements["transformer.h.0.attn.proj.weight"] == "(Shard(dim=1), Shard(dim=0))"
    assert placements["transformer.wte.weight"] == "(Replicate(), Shard(dim=0))"  # whole, sharded by fsdp


def test_parallelize_module_layouts_not_traced_are_refused_clearly(runs):
    ranks, results = runs
    errors = results["parallelize_module_refused"]
    assert "SequenceParallel" in errors["sequence_parallel_norm"]
    assert "ColwiseParallel" in errors["colwise_replicated_output"]
    assert "PrepareModuleInput" in errors["prepare_module_input"]
    assert "MixedPrecisionPolicy" in errors["mixed_precision"]
    assert "['fsdp']" in errors["with_fsdp_plugin"] and "already sharded" in errors["with_fsdp_plugin"]
    for label, error in errors.items():
        if label.endswith("runs eagerly"):
            assert error is True, label  # nothing was removed from the refused model
        elif label != "with_fsdp_plugin":
            assert "plugins=['tensor-parallel']" in error, label  # what composes instead


@pytest.mark.parametrize("scenario", [*TRAINED, *MESH_2D])
def test_each_rank_holds_its_share_of_the_split_layers(runs, scenario):
    ranks, results = runs
    if scenario not in results:
        pytest.skip(f"{scenario} runs on 4 ranks")
    result = results[scenario]
    assert len(result["local_shapes"]) == ranks
    tensor_size = 2 if scenario in MESH_2D else ranks
    sharded_by_fsdp = "_fsdp_" in scenario
    split = 0
    for name, full in result["full_shapes"].items():
        held = [shapes[name] for shapes in result["local_shapes"]]
        local = held[0]
        if sharded_by_fsdp:
            continue  # every rank's part is cut again on dim 0 (padded): counted below
        if local != full:
            split += 1
            for local in held:  # every rank the same share: one dimension divided by the ranks
                assert [a * tensor_size if a != b else a for a, b in zip(local, full)] == list(full), (
                    name,
                    held,
                    full,
                )
    if not sharded_by_fsdp:
        assert split >= 10  # the 5 (litgpt) or 7 (Llama) projections of both layers
    full_elements, local_elements = result["elements"]
    if sharded_by_fsdp:
        # The projections split over the tensor dimension and everything sharded over the data one:
        # less than either alone would leave (half, or more), at least a quarter.
        assert full_elements / ranks <= local_elements < full_elements / 2
    else:
        assert (
            full_elements / tensor_size < local_elements < full_elements
        )  # embeddings, norms and the head are whole


def test_a_checkpoint_saved_under_tensor_parallel_loads_in_one_process(runs, references):
    """The DCP checkpoint of 2 tensor-parallel ranks, loaded by one plain process (no process
    group), continues as training straight through does."""
    ranks, results = runs
    if ranks != 2:
        pytest.skip("the checkpoint is written by the 2-rank run")
    import torch.distributed.checkpoint as dcp

    worker = _worker()
    placements = results["dcp_to_fsdp"]["placements"]
    assert "(Shard(dim=1),)" in placements["transformer.h.0.attn.proj.weight"]  # row-parallel
    assert "(Shard(dim=0),)" in placements["transformer.h.0.mlp.fc_1.weight"]  # column-parallel
    assert "(Replicate(),)" in placements["transformer.h.0.attn.qkv.weight"]  # split by heads
    torch.manual_seed(123)
    model = worker.build_litgpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=worker.LR)
    from thunder_plugin_distributed import load_optimizer_state_dict, optimizer_state_dict

    state = {"model": model.state_dict(), "optimizer": optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(results["out"] / "dcp"), no_dist=True)
    model.load_state_dict(state["model"])
    load_optimizer_state_dict(model, optimizer, state["optimizer"])
    losses = worker.train(
        model, steps=worker.STEPS - worker.SAVED_AFTER, optimizer=optimizer, first=worker.SAVED_AFTER
    )
    reference = references["litgpt"]
    torch.testing.assert_close(
        torch.tensor(losses), torch.tensor(reference["losses"][worker.SAVED_AFTER :]), **TOLERANCE
    )
    _assert_same_parameters(model.state_dict(), reference["params"])


@pytest.mark.skipif("litgpt_checkpoint" not in SCENARIOS, reason="thunder-plugin-checkpoint is not installed")
def test_with_activation_checkpointing_the_blocks_save_less(runs):
    ranks, results = runs
    assert results["litgpt_checkpoint"]["saved_by_blocks"] < results["litgpt"]["saved_by_blocks"]
