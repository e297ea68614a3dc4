"""Under torchrun: a job that imports torch.distributed.nn after init (as torch._dynamo does) exits cleanly.

Each rank trains one step with the ``ddp`` plugin, imports ``torch.distributed.nn``, destroys
the process group, then runs the interpreter's exit hooks and writes which gloo threads were
alive before and after them to ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys

import torch
import torch.distributed as dist

import thunder_core


def gloo_threads() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # the thread ended since the listing
            continue
    return sorted(name for name in names if "gloo" in name)


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    jitted = thunder_core.jit(model, plugins=["ddp"])
    jitted(torch.randn(4, 8)).sum().backward()
    importlib.import_module("torch.distributed.nn")  # binds the live default group as a default argument

    loss = torch.ones(())
    dist.all_reduce(loss)
    dist.destroy_process_group()
    after_destroy = gloo_threads()
    atexit._run_exitfuncs()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"after_destroy": after_destroy, "after_exit_hooks": gloo_threads()}, f)


if __name__ == "__main__":
    main(sys.argv[1])
