"""Tensor-parallel training scenarios run by each rank under torchrun (started by
test_tensor_parallel.py).

    python -m torch.distributed.run --nproc-per-node N tp_worker.py OUT_DIR SCENARIO [SCENARIO ...]

Every rank trains on the whole global batch (tensor parallelism splits the layers, not the data)
for ``STEPS`` AdamW steps and writes ``OUT_DIR/SCENARIO-<world size>.pt`` from rank 0: the losses,
the full final parameters (gathered by the plugin's ``state_dict``), and each rank's shapes and
number of parameter elements.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from thunder_plugin_distributed import full_state_dict

import thunder_core
from thunder_core.testing.models import small_litgpt

STEPS = 5
BATCH, LENGTH, VOCAB = 2, 16, 96
LR = 1e-3


def build_litgpt():
    torch.manual_seed(0)
    return small_litgpt(n_layer=2, n_embd=64, vocab=VOCAB, block_size=32, n_query_groups=4)


def build_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, use_cache=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def batches():
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=generator) for _ in range(STEPS)]


def loss_of(model, tokens):
    out = model(tokens[:, :-1])
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train(model, steps: int = STEPS, rows=slice(None), optimizer=None, first: int = 0) -> list[float]:
    """``steps`` AdamW steps from batch ``first`` on; each batch's ``rows`` (this rank's data)."""
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for tokens in batches()[first : first + steps]:
        loss = loss_of(model, tokens[rows])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def reference(build) -> dict:
    """One eager process over the same batches."""
    model = build()
    losses = train(model)
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def _saved_by_blocks(jitted) -> tuple[list, int]:
    """The first input's shape of each block's forward, and the bytes its calls save for the backward."""
    shapes, saved = [], 0
    for block in thunder_core.last_blocks(jitted):
        forward = [t for t in block.traces if t.decisions][-1]
        shapes.append(tuple(forward.inputs[0].shape))
        outputs = forward.output[1] if isinstance(forward.output, tuple) and len(forward.output) == 2 else ()
        names = {p.name for p in forward.inputs}
        for p in outputs:
            if isinstance(p, torch.Tensor) and p.name not in names:
                saved += block.calls * p.numel() * p.dtype.itemsize
    return shapes, saved


def _scenario(
    build, sequence_parallel: bool = False, checkpoint: bool = False, data: str = "", given_mesh: bool = False
) -> dict:
    """``data``: "fsdp" or "ddp" over the data dimension of a (world/2, 2) mesh, each data-parallel
    rank training on its rows of the global batch."""
    model = build()
    full = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    elements = sum(p.numel() for p in model.parameters())
    options = {"tensor-parallel": {"sequence_parallel": sequence_parallel}}
    plugins = ["tensor-parallel"]
    rows = slice(None)
    if data:
        plugins.append(data)
        if given_mesh:  # the user's own DeviceMesh, dimensions in the other order
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("tensor", "data"))
            options["tensor-parallel"]["mesh"] = mesh
            # rank = tensor * data_size + data here: the data rank is the rank modulo data_size
        else:
            options["tensor-parallel"]["size"] = 2
        data_size = dist.get_world_size() // 2
        data_rank = dist.get_rank() % data_size if given_mesh else dist.get_rank() // 2
        rows = slice(data_rank * BATCH // data_size, (data_rank + 1) * BATCH // data_size)
    if checkpoint:  # activation checkpointing of every block (thunder-plugin-checkpoint)
        plugins.append("checkpoint")
        options["checkpoint"] = {"policy": "blocks"}
    jitted = thunder_core.jit(model, plugins=plugins, options=options)
    losses = train(jitted, rows=rows)
    if data:  # the loss of the global batch: the mean of the data-parallel ranks' losses
        losses = _mean_over_ranks(losses)
    # What every rank holds after training, gathered to rank 0.
    mine = {k: tuple(p.shape) for k, p in model.named_parameters()}
    held: list = [None] * dist.get_world_size()
    dist.all_gather_object(held, mine)
    forward = [t for t in thunder_core.last_traces(jitted) if t.decisions][0]
    backward = [t for t in thunder_core.last_backward_traces(jitted) if t.decisions][-1]
    names = [b.symbol.name for t in (forward, backward) for b in t.bound_symbols]
    names += [
        b.symbol.name for block in thunder_core.last_blocks(jitted) for t in (*block.traces, *block.backward_traces)
        for b in t.bound_symbols
    ]  # fmt: skip
    block_inputs, saved = _saved_by_blocks(jitted)
    return {
        "losses": losses,
        "block_inputs": block_inputs,
        "saved_by_blocks": saved,
        "params": full_state_dict(jitted),
        "full_shapes": full,
        "local_shapes": held,  # one dict per rank
        "elements": (elements, sum(p.numel() for p in model.parameters())),
        "block_backward_ops": [
            [b.symbol.name for b in block.backward_traces[-1].bound_symbols]
            for block in thunder_core.last_blocks(jitted)
        ],
        "collectives": {
            name: names.count(name)
            for name in (
                "tp_copy",
                "tp_all_reduce",
                "tp_all_reduce_start",
                "tp_all_gather_sequence",
                "tp_reduce_scatter_sequence",
                "tp_split_sequence",
                "tp_gather_sequence",
            )
        },  # fmt: skip
    }


def _mean_over_ranks(losses: list[float]) -> list[float]:
    values = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(values)
    return (values / dist.get_world_size()).tolist()


def scenario_litgpt() -> dict:
    return _scenario(build_litgpt)


def scenario_llama() -> dict:
    return _scenario(build_llama)


def scenario_litgpt_sequence() -> dict:
    return _scenario(build_litgpt, sequence_parallel=True)


def scenario_llama_sequence() -> dict:
    return _scenario(build_llama, sequence_parallel=True)


def scenario_litgpt_checkpoint() -> dict:
    return _scenario(build_litgpt, checkpoint=True)


def scenario_litgpt_fsdp_2d() -> dict:
    return _scenario(build_litgpt, data="fsdp")


def scenario_llama_fsdp_2d() -> dict:
    return _scenario(build_llama, data="fsdp")


def scenario_llama_fsdp_2d_given_mesh() -> dict:
    return _scenario(build_llama, data="fsdp", given_mesh=True)


def scenario_stacks_refused() -> dict:
    """Stacks of plugins and options that cannot work: a clear error each; a refused model is left
    as it was, so jit with corrected options works."""
    errors = {}
    for label, plugins, options in [
        ("fsdp_first", ["fsdp", "tensor-parallel"], {}),
        ("no_data_dimension", ["tensor-parallel", "fsdp"], {}),
        ("size_not_dividing", ["tensor-parallel"], {"tensor-parallel": {"size": 3}}),
    ]:
        model = build_litgpt()
        try:
            thunder_core.jit(model, plugins=plugins, options=options)
            errors[label] = None
        except thunder_core.ThunderCoreError as error:
            errors[label] = str(error)
        if label == "size_not_dividing":  # the same model, jitted again with a valid size
            jitted = thunder_core.jit(model, plugins=["tensor-parallel"])
            errors["retried_losses"] = train(jitted, steps=1)
    # A data dimension with nothing to work over it: refused at the first call.
    jitted = thunder_core.jit(
        build_litgpt(), plugins=["tensor-parallel"], options={"tensor-parallel": {"size": 1}}
    )
    try:
        train(jitted, steps=1)
        errors["size_alone"] = None
    except thunder_core.ThunderCoreError as error:
        errors["size_alone"] = str(error)
    return errors


def scenario_litgpt_ddp_2d() -> dict:
    return _scenario(build_litgpt, data="ddp")


def scenario_litgpt_sequence_fsdp_2d() -> dict:
    return _scenario(build_litgpt, sequence_parallel=True, data="fsdp")


def _parallelized(build, plan: dict) -> dict:
    """PyTorch's own tensor parallelism (parallelize_module) on a model, then thunder_core.jit of
    it: the dtensor plugin traces the DTensor parameters."""
    from torch.distributed.tensor.parallel import parallelize_module

    return _sharded_by_pytorch(build, lambda model, mesh: parallelize_module(model, mesh, plan))


def _fully_sharded(build, blocks) -> dict:
    """FSDP2 (fully_shard of each block, then of the root), then thunder_core.jit; every rank
    trains on the same batch (the averaged gradient is then the one-process gradient)."""
    from torch.distributed.fsdp import fully_shard

    def shard(model, mesh):
        for block in blocks(model):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    return _sharded_by_pytorch(build, shard)


def _sharded_by_pytorch(build, shard) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    model = build()
    full = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    shard(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    jitted = thunder_core.jit(model)
    losses = train(jitted, optimizer=optimizer)
    mine = {
        k: tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)
        for k, p in model.named_parameters()
    }
    held: list = [None] * dist.get_world_size()
    dist.all_gather_object(held, mine)
    names = [
        b.symbol.name
        for t in (*thunder_core.last_traces(jitted), *thunder_core.last_backward_traces(jitted))
        for b in t.bound_symbols
    ]
    names += [
        b.symbol.name for block in thunder_core.last_blocks(jitted) for t in (*block.traces, *block.backward_traces)
        for b in t.bound_symbols
    ]  # fmt: skip
    params = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    return {
        "losses": losses,
        "params": params,
        "extensions": [e.name for e in jitted.extensions],
        "full_shapes": full,
        "local_shapes": held,
        "collectives": {
            name: names.count(name)
            for name in ("tp_copy", "tp_all_reduce", "tp_all_reduce_start", "fsdp_all_gather_again")
        },
    }


def scenario_llama_parallelize_module() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {
        **{f"model.layers.*.self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
        "model.layers.*.self_attn.o_proj": RowwiseParallel(),
        "model.layers.*.mlp.gate_proj": ColwiseParallel(),
        "model.layers.*.mlp.up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel(),
    }
    return _parallelized(build_llama, plan)


def scenario_litgpt_parallelize_module() -> dict:
    """litgpt's MLPs (its fused qkv is laid out by heads, which no ParallelStyle splits)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {
        "transformer.h.*.mlp.fc_1": ColwiseParallel(),
        "transformer.h.*.mlp.fc_2": ColwiseParallel(),
        "transformer.h.*.mlp.proj": RowwiseParallel(),
    }
    return _parallelized(build_litgpt, plan)


def scenario_litgpt_fully_shard() -> dict:
    return _fully_sharded(build_litgpt, lambda model: model.transformer.h)


def scenario_llama_fully_shard() -> dict:
    return _fully_sharded(build_llama, lambda model: model.model.layers)


def scenario_parallelize_module_refused() -> dict:
    """Layouts the dtensor plugin does not trace: a clear error each, before anything changes (the
    model still runs eagerly, as PyTorch sharded it)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    cases = {
        "sequence_parallel_norm": lambda m: parallelize_module(
            m, mesh, {"transformer.h.0.norm_1": SequenceParallel()}
        ),
        "colwise_replicated_output": lambda m: parallelize_module(
            m, mesh, {"transformer.h.0.mlp.fc_1": ColwiseParallel(output_layouts=Replicate())}
        ),
        "prepare_module_input": lambda m: parallelize_module(
            m,
            mesh,
            {
                "transformer.h.0.mlp": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "transformer.h.0.mlp.fc_1": ColwiseParallel(),
            },
        ),
        "mixed_precision": lambda m: fully_shard(m, mesh=mesh, mp_policy=bf16),
        "with_fsdp_plugin": lambda m: fully_shard(m, mesh=mesh),
    }
    errors = {}
    tokens = batches()[0]
    for label, shard in cases.items():
        model = build_litgpt()
        shard(model)
        try:
            thunder_core.jit(model, plugins=["fsdp"] if label == "with_fsdp_plugin" else None)
            errors[label] = None
        except thunder_core.ThunderCoreError as error:
            errors[label] = str(error)
        if label in ("colwise_replicated_output", "mixed_precision", "with_fsdp_plugin"):  # runnable layouts
            errors[f"{label} runs eagerly"] = bool(torch.isfinite(loss_of(model, tokens)).item())
    return errors


SAVED_AFTER = 3  # steps trained before the checkpoint is written


def _resumed(path: str, plugins: list[str], losses: list[float], placements: dict) -> dict:
    """A fresh job (other initial weights) under ``plugins`` loads the checkpoint at ``path`` and
    trains the steps after SAVED_AFTER."""
    import torch.distributed.checkpoint as dcp
    from thunder_plugin_distributed import load_optimizer_state_dict, optimizer_state_dict

    torch.manual_seed(123)
    fresh = thunder_core.jit(
        small_litgpt(n_layer=2, n_embd=64, vocab=VOCAB, block_size=32, n_query_groups=4), plugins=plugins
    )
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=LR)
    state = {"model": fresh.state_dict(), "optimizer": optimizer_state_dict(fresh, fresh_optimizer)}
    dcp.load(state, checkpoint_id=path)
    fresh.load_state_dict(state["model"])
    load_optimizer_state_dict(fresh, fresh_optimizer, state["optimizer"])
    losses += train(fresh, steps=STEPS - SAVED_AFTER, optimizer=fresh_optimizer, first=SAVED_AFTER)
    return {"losses": losses, "params": full_state_dict(fresh), "placements": placements}


def scenario_dcp_2d_to_tensor_parallel() -> dict:
    """As dcp_to_fsdp, on 4 ranks: saved under tensor-parallel + fsdp on a 2 x 2 mesh (each data
    rank on its rows), loaded under tensor-parallel over the 4 ranks."""
    import torch.distributed.checkpoint as dcp
    from thunder_plugin_distributed import optimizer_state_dict

    path = os.path.join(os.environ["THUNDER_TEST_OUT"], "dcp_2d")
    options = {"tensor-parallel": {"size": 2}}
    jitted = thunder_core.jit(build_litgpt(), plugins=["tensor-parallel", "fsdp"], options=options)
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    data_rank = dist.get_rank() // 2
    rows = slice(data_rank * BATCH // 2, (data_rank + 1) * BATCH // 2)
    losses = _mean_over_ranks(train(jitted, steps=SAVED_AFTER, optimizer=optimizer, rows=rows))
    state = {"model": jitted.state_dict(), "optimizer": optimizer_state_dict(jitted, optimizer)}
    placements = {k: str(v.placements) for k, v in state["model"].items() if hasattr(v, "placements")}
    dcp.save(state, checkpoint_id=path)

    return _resumed(path, ["tensor-parallel"], losses, placements)


def scenario_dcp_to_fsdp() -> dict:
    """Train SAVED_AFTER steps under tensor-parallel, save model and optimizer with
    torch.distributed.checkpoint; a fresh model under fsdp (another layout) loads them and trains
    the remaining steps. The checkpoint stays in OUT_DIR/dcp for a one-process job to load."""
    import torch.distributed.checkpoint as dcp
    from thunder_plugin_distributed import optimizer_state_dict

    path = os.path.join(os.environ["THUNDER_TEST_OUT"], "dcp")
    jitted = thunder_core.jit(build_litgpt(), plugins=["tensor-parallel"])
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    losses = train(jitted, steps=SAVED_AFTER, optimizer=optimizer)
    state = {"model": jitted.state_dict(), "optimizer": optimizer_state_dict(jitted, optimizer)}
    placements = {k: str(v.placements) for k, v in state["model"].items() if hasattr(v, "placements")}
    dcp.save(state, checkpoint_id=path)

    return _resumed(path, ["fsdp"], losses, placements)


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:]
    os.environ["THUNDER_TEST_OUT"] = out
    dist.init_process_group("gloo")
    try:
        for name in names:
            print(f"rank {dist.get_rank()}: {name}", flush=True)
            result = globals()[f"scenario_{name}"]()
            if dist.get_rank() == 0:
                torch.save(result, os.path.join(out, f"{name}-{dist.get_world_size()}.pt"))
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    faulthandler.enable(all_threads=True)
    tempfile.tempdir = None
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
