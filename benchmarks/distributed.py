"""Data-parallel and sharded training on 2 processes: thunder_core's ddp / fsdp against PyTorch's.

    python benchmarks/distributed.py            # starts torchrun --nproc-per-node 2 per backend

A litgpt ``GPT`` (4 layers, width 256) trains with AdamW on 2 ranks (gloo on CPU, NCCL on GPUs),
each on 2 x 256 tokens. Per backend, in a fresh job: the median step time (rank 0), the peak
resident memory one step adds (the larger of the two ranks) and the bytes of parameters,
gradients and optimizer state each rank holds between steps. Backends: PyTorch
DistributedDataParallel and FSDP2 ``fully_shard`` (eager and under ``torch.compile``), and
``thunder_core.jit`` with the ``ddp`` and ``fsdp`` (ZeRO-3 and ZeRO-2) plugins and the default
executors. Ratios are against PyTorch DDP eager measured in the same run.
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
]
LENGTH, LOCAL_BATCH, VOCAB = 256, 2, 4096


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(backend: str):
    import torch
    import torch.distributed as dist

    from thunder_core.testing.models import small_litgpt

    torch.manual_seed(0)
    model = small_litgpt(n_layer=4, n_embd=256, vocab=VOCAB, block_size=LENGTH)
    if backend.startswith("torch-ddp"):
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
        return (torch.compile(wrapped) if backend.endswith("compile") else wrapped), wrapped.parameters()
    if backend.startswith("torch-fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return (torch.compile(model) if backend.endswith("compile") else model), model.parameters()
    import thunder_core

    plugin, *zero = backend.removeprefix("thunder-").split("-")
    options = {"fsdp": {"zero": 2}} if zero else None
    jitted = thunder_core.jit(model, plugins=[plugin], options=options)
    return jitted, jitted.parameters()


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
    generator = torch.Generator().manual_seed(rank)
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
    baseline = None
    for backend in args.backends:
        result = launch(backend, args.steps)
        if "error" in result:
            print(f"{backend:22s}  failed: {result['error']}")
            continue
        ms = result["step_s"] * 1e3
        baseline = baseline or (ms if backend == "torch-ddp" else None)
        ratio = f"{baseline / ms:7.2f}x" if baseline else f"{'-':>8s}"
        print(
            f"{backend:22s}{ms:9.1f}{ratio}{result['peak_bytes'] / 2**20:14.1f}{result['held_bytes'] / 2**20:14.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
