"""The elementwise chain ``gelu(x * w + b) * 0.5 + x`` on 16M float32, CPU.

Eager, torch.compile and thunder_core with each fusion executor installed, plus this
machine's bandwidth from a plain copy into a preallocated output, measured in the same run.
Throughput counts the bytes each call must move: three inputs read, one output written.

    python benchmarks/elementwise.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import median_seconds  # noqa: E402

import thunder_core  # noqa: E402
from thunder_core.plugins.manager import plugin_manager  # noqa: E402

N = 16 * 2**20


def chain(x, w, b):
    return torch.nn.functional.gelu(x * w + b) * 0.5 + x


def main() -> None:
    torch.manual_seed(0)
    x, w, b = (torch.randn(N) for _ in range(3))
    out = torch.empty(N)
    copy_s = median_seconds(lambda: out.copy_(x), repeats=20)
    bandwidth = 2 * N * 4 / copy_s
    moved = 4 * N * 4
    backends = {"eager": chain, "torch.compile": torch.compile(chain)}
    for name in ("numba", "inductor"):
        info = plugin_manager().plugins.get(name)
        if info is not None and plugin_manager().load(info).status == "available":
            backends[f"thunder_core[{name}]"] = thunder_core.jit(chain, executors=[name])
    backends["thunder_core[torch only]"] = thunder_core.jit(chain, executors=[])
    expected = chain(x, w, b)
    results = {}
    for name, fn in backends.items():
        torch.testing.assert_close(fn(x, w, b), expected, atol=1e-5, rtol=1e-5)
        results[name] = moved / median_seconds(lambda fn=fn: fn(x, w, b), repeats=10)
    eager, compiled = results["eager"], results["torch.compile"]
    print(f"gelu(x * w + b) * 0.5 + x, {N:,} float32 elements, {torch.get_num_threads()} threads")
    print(f"plain copy: {bandwidth / 1e9:.1f} GB/s (the machine's bandwidth)")
    print(f"{'backend':26s} {'GB/s':>7s} {'vs eager':>9s} {'vs compile':>11s} {'of copy':>8s}")
    for name, rate in results.items():
        print(
            f"{name:26s} {rate / 1e9:7.2f} {rate / eager:8.2f}x {rate / compiled:10.2f}x {rate / bandwidth:7.0%}"
        )


if __name__ == "__main__":
    main()
