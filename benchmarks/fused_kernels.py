"""The time a training step spends in Inductor's generated kernels, per kernel, for each backend.

    python benchmarks/fused_kernels.py --model llama
    python benchmarks/fused_kernels.py --model litgpt --rounds 3 --top 8

Both ``torch.compile`` and thunder_core's Inductor executor run their fused kernels from Python
modules Inductor generates (``cpp_fused_*`` functions). Each backend runs in a fresh process per
round, interleaved (A B A B ...); after a few warm-up steps every generated kernel is wrapped
in a timer, and ten steps are timed. Prints per round the step's median time and the total time
in generated kernels per step, then the heaviest kernels of each backend's last round. A kernel
that is slower for one backend than the other's kernel for the same work shows what a backend's
graph costs beyond the library calls (matmuls, attention) both make alike. The timers add a few
microseconds per kernel call to the step.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BACKENDS = ("torch.compile", "thunder_core")


def measure(backend: str, name: str, top: int) -> dict:
    import torch
    from backends import wrap
    from torch._inductor.codecache import PyCodeCache
    from training_step import BATCH, LENGTH, build_model, step_of

    model = wrap(build_model(name), backend)
    idx = torch.randint(0, 2048, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    step = step_of(model, idx, name)

    for _ in range(4):
        step()
    seconds, calls = collections.Counter(), collections.Counter()
    for module in list(PyCodeCache.modules):
        for attribute, kernel in list(vars(module).items()):
            if not attribute.startswith("cpp_fused"):
                continue
            key = f"{attribute} ({module.__name__[-6:]})"

            def timed(*args, _kernel=kernel, _key=key):
                start = time.perf_counter()
                _kernel(*args)
                seconds[_key] += time.perf_counter() - start
                calls[_key] += 1

            setattr(module, attribute, timed)
    steps, times = 10, []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    heaviest = [(k, s / steps * 1e3, calls[k] // steps) for k, s in seconds.most_common(top)]
    return {
        "step_ms": statistics.median(times) * 1e3,
        "kernels_ms": sum(seconds.values()) / steps * 1e3,
        "kernel_calls": sum(calls.values()) // steps,
        "heaviest": heaviest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", help="measure one backend in this process (internal)")
    parser.add_argument("--model", choices=("litgpt", "llama"), default="llama")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(measure(args.backend, args.model, args.top)))
        return
    from measure import run_isolated

    results = {b: [] for b in BACKENDS}
    for _ in range(args.rounds):
        for backend in BACKENDS:
            extra = ["--backend", backend, "--model", args.model, "--top", str(args.top)]
            results[backend].append(run_isolated(__file__, *extra))
    print(
        f"{args.model} 4-layer training step, Inductor's generated kernels, {args.rounds} interleaved rounds"
    )
    for backend, rounds in results.items():
        steps = " ".join(f"{r['step_ms']:6.1f}" for r in rounds)
        kernels = " ".join(f"{r['kernels_ms']:6.2f}" for r in rounds)
        median = statistics.median(r["kernels_ms"] for r in rounds)
        print(f"  {backend:15s} step ms {steps} | kernels ms/step {kernels} (median {median:.2f}, "
              f"{rounds[-1]['kernel_calls']} calls/step)")  # fmt: skip
    for backend, rounds in results.items():
        print(f"heaviest kernels of {backend} (last round), ms per step, calls per step:")
        for key, ms, count in rounds[-1]["heaviest"]:
            print(f"  {ms:6.2f} ms {count:3d}x  {key[:110]}")


if __name__ == "__main__":
    main()
