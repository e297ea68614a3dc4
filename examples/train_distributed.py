"""Train a small litgpt GPT with thunder_core on one process or many; the configuration decides how.

    # one process
    python examples/train_distributed.py
    # 2 processes, data parallel / sharded, chosen by configuration only:
    THUNDER_CORE_PLUGINS=ddp  torchrun --nproc-per-node 2 examples/train_distributed.py
    THUNDER_CORE_PLUGINS=fsdp torchrun --nproc-per-node 2 examples/train_distributed.py
    # or in pyproject.toml: [tool.thunder-core] plugins = ["fsdp"], options = { fsdp = { zero = 2 } }

The script itself never names a plugin: it initializes torch.distributed when torchrun started
it, jits the model, and makes the optimizer from the jitted module's parameters (after jit:
with fsdp they are this rank's shards). Each rank trains on its slice of the global batch.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import thunder_core
from thunder_core.testing.models import small_litgpt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ  # set by torchrun
    if distributed:
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(0)  # every rank builds the same model (ddp and fsdp also broadcast rank 0's)
    model = small_litgpt(n_layer=4, n_embd=128, vocab=512, block_size=args.length)
    jitted = thunder_core.jit(model)  # plugins come from THUNDER_CORE_PLUGINS or [tool.thunder-core]
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=1e-3)

    generator = torch.Generator().manual_seed(1)
    share = args.global_batch // world
    for step in range(args.steps):
        tokens = torch.randint(0, 512, (args.global_batch, args.length + 1), generator=generator)
        local = tokens[rank * share : (rank + 1) * share]
        logits = jitted(local[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), local[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if distributed:
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= world
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}")

    held = sum(p.numel() * p.element_size() for p in jitted.parameters())
    plugins = [e.name for e in jitted.extensions] or ["none"]
    # One write per line: the ranks share the terminal, and print's separate write of the newline
    # could land after another rank's line.
    sys.stdout.write(f"rank {rank}/{world}: plugins {plugins}, parameters held {held / 2**20:.2f} MiB\n")
    sys.stdout.flush()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
