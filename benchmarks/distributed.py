"""Data-parallel, sharded and tensor-parallel training on 2 processes: thunder_core against PyTorch.

    python benchmarks/distributed.py            # starts torchrun --nproc-per-node 2 per backend

A litgpt ``GPT`` (4 layers, width 256) trains with AdamW on 2 ranks (gloo on CPU, NCCL on GPUs),
each on 2 x 256 tokens. Per backend, in a fresh job: the median step time (rank 0), the peak
resident memory one step adds (the larger of the two ranks) and the bytes of parameters,
gradients and optimizer state each rank holds between steps. Backends: PyTorch
DistributedDataParallel and FSDP2 ``fully_shard`` (eager and under ``torch.compile``), and
``thunder_core.jit`` with the ``ddp`` and ``fsdp`` (ZeRO-3 and ZeRO-2) plugins and the default
executors. Ratios are against PyTorch DDP eager measured in the same run.

Tensor parallelism (both ranks on the same 2 x 256 tokens): PyTorch's ``parallelize_module``
(``ColwiseParallel`` on the attention's fused qkv and the MLP's fc_1/fc_2, ``RowwiseParallel`` on
the projections; the qkv rows ordered so that each rank's part holds its heads, and the attention
given the per-rank head counts, as thunder_core's plugin does), eager and under
``torch.compile``, against ``thunder_core.jit`` with the ``tensor-parallel`` plugin, without and
with ``sequence_parallel``. Their ratios are against PyTorch TP eager.

``thunder-jit-torch-fsdp2`` and ``thunder-jit-torch-tp``: the model PyTorch sharded (as in
``torch-fsdp2`` and ``torch-tp``), then ``thunder_core.jit`` of it (the ``dtensor`` plugin).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BACKENDS = [
    "torch-ddp",
    "torch-ddp-compile",
    "torch-fsdp2",
    "torch-fsdp2-compile",
    "thunder-ddp",
    "thunder-fsdp",
    "thunder-fsdp-zero2",
    "torch-tp",
    "torch-tp-compile",
    "thunder-tp",
    "thunder-tp-sequence",
    "thunder-jit-torch-fsdp2",
    "thunder-jit-torch-tp",
]
LENGTH, LOCAL_BATCH, VOCAB = 256, 2, 4096


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(backend: str, model=None):
    import torch
    import torch.distributed as dist

    from thunder_core.testing.models import small_litgpt

    if model is None:
        torch.manual_seed(0)
        model = small_litgpt(n_layer=4, n_embd=256, vocab=VOCAB, block_size=LENGTH)
    if backend.startswith("torch-ddp"):
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
        return (torch.compile(wrapped) if backend.endswith("compile") else wrapped), wrapped.parameters()
    if backend.startswith("thunder-jit-torch-"):  # PyTorch shards the model, thunder_core.jit compiles it
        import thunder_core

        _build(backend.removeprefix("thunder-jit-"), model)
        jitted = thunder_core.jit(model)  # the dtensor plugin, chosen by jit
        return jitted, jitted.parameters()
    if backend.startswith("torch-fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return (torch.compile(model) if backend.endswith("compile") else model), model.parameters()
    if backend.startswith("torch-tp"):
        _torch_tensor_parallel(model, dist.get_world_size())
        return (torch.compile(model) if backend.endswith("compile") else model), model.parameters()
    import thunder_core

    if backend.startswith("thunder-tp"):
        options = {"tensor-parallel": {"sequence_parallel": backend.endswith("sequence")}}
        jitted = thunder_core.jit(model, plugins=["tensor-parallel"], options=options)
        return jitted, jitted.parameters()
    plugin, *zero = backend.removeprefix("thunder-").split("-")
    options = {"fsdp": {"zero": 2}} if zero else None
    jitted = thunder_core.jit(model, plugins=[plugin], options=options)
    return jitted, jitted.parameters()


def _torch_tensor_parallel(model, size: int) -> None:
    """PyTorch's tensor parallelism of a litgpt GPT: the same split as thunder_core's plugin."""
    import dataclasses

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (size,))
    config = model.config
    local = dataclasses.replace(
        config,
        n_head=config.n_head // size,
        n_query_groups=config.n_query_groups // size,
        head_size=config.head_size,
    )
    q, kv = config.n_head * config.head_size, config.n_query_groups * config.head_size
    plan = {}
    for i, block in enumerate(model.transformer.h):
        with torch.no_grad():  # rows ordered rank by rank (q, k, v heads of rank 0, then rank 1, ...)
            weight = block.attn.qkv.weight
            parts = [weight[:q].chunk(size), weight[q : q + kv].chunk(size), weight[q + kv :].chunk(size)]
            weight.copy_(torch.cat([torch.cat([p[r] for p in parts]) for r in range(size)]))
        block.attn.config = local
        plan.update({f"transformer.h.{i}.attn.qkv": ColwiseParallel(), f"transformer.h.{i}.attn.proj": RowwiseParallel(),
                     f"transformer.h.{i}.mlp.fc_1": ColwiseParallel(), f"transformer.h.{i}.mlp.fc_2": ColwiseParallel(),
                     f"transformer.h.{i}.mlp.proj": RowwiseParallel()})  # fmt: skip
    parallelize_module(model, mesh, plan)


def _held_bytes(parameters, optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds (local shards of DTensors)."""
    import torch

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for p in parameters:
        total += local(p).numel() * p.element_size() * (2 if p.grad is not None else 1)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim():
                total += local(value).numel() * value.element_size()
    return total


def worker(backend: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    sys.path.insert(0, str(HERE))
    from measure import median_seconds, peak_memory_bytes

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, parameters = _build(backend)
    parameters = list(parameters)
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    generator = torch.Generator().manual_seed(0 if "tp" in backend else rank)  # tensor parallel: one batch
    tokens = torch.randint(0, VOCAB, (LOCAL_BATCH, LENGTH + 1), generator=generator)

    def step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    seconds = median_seconds(step, warmup=2, repeats=steps)
    peak = peak_memory_bytes(step)
    held = _held_bytes(parameters, optimizer)
    stats = torch.tensor([peak, held], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"step_s": seconds, "peak_bytes": stats[0].item(), "held_bytes": stats[1].item()}))
    dist.destroy_process_group()


def launch(backend: str, steps: int) -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2)),
        "MALLOC_MMAP_THRESHOLD_": "65536",
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), __file__, "--worker", backend, "--steps", str(steps),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {
            "error": done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else f"exit {done.returncode}"
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description="thunder_core ddp/fsdp against PyTorch DDP/FSDP2 on 2 processes"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--backends", nargs="*", default=BACKENDS, choices=BACKENDS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    print(f"litgpt 4 layers, width 256, vocab {VOCAB}; 2 ranks x {LOCAL_BATCH}x{LENGTH} tokens; AdamW")
    print(f"{'backend':22s}{'step ms':>9s}{'vs DDP':>8s}{'peak MB/rank':>14s}{'held MB/rank':>14s}")
    print("(tensor-parallel rows: both ranks on the same tokens, ratio against PyTorch TP)")
    baseline = tp_baseline = None
    for backend in args.backends:
        result = launch(backend, args.steps)
        if "error" in result:
            print(f"{backend:22s}  failed: {result['error']}")
            continue
        ms = result["step_s"] * 1e3
        if backend == "torch-ddp":
            baseline = ms
        if backend == "torch-tp":
            tp_baseline = ms
        reference = tp_baseline if "-tp" in backend else baseline
        ratio = f"{reference / ms:7.2f}x" if reference else f"{'-':>8s}"
        print(
            f"{backend:22s}{ms:9.1f}{ratio}{result['peak_bytes'] / 2**20:14.1f}{result['held_bytes'] / 2**20:14.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
