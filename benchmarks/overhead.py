"""Cached per-call overhead of ``lambda a, b: a + b`` on small tensors.

Eager, torch.compile and thunder_core, measured in the same run; prints microseconds per
call (median of repeated timings) and each backend's ratio to eager.

    python benchmarks/overhead.py
"""

from __future__ import annotations

import statistics
import timeit

import torch

import thunder_core


def per_call_us(fn, a, b, *, number: int = 20000, repeat: int = 15) -> float:
    for _ in range(100):
        fn(a, b)
    times = timeit.repeat(lambda: fn(a, b), number=number, repeat=repeat)
    return statistics.median(times) / number * 1e6


def main() -> None:
    torch.set_num_threads(1)
    a, b = torch.randn(4, 4), torch.randn(4, 4)

    def add(a, b):
        return a + b

    backends = {
        "eager": add,
        "torch.compile": torch.compile(add),
        "thunder_core": thunder_core.jit(add),
    }
    for fn in backends.values():
        torch.testing.assert_close(fn(a, b), a + b)
    results = {name: per_call_us(fn, a, b) for name, fn in backends.items()}
    eager = results["eager"]
    print(f"cached call of `a + b` on 4x4 float32 tensors (torch {torch.__version__})")
    for name, us in results.items():
        print(
            f"  {name:14s} {us:7.2f} us/call   {us / eager:5.2f}x eager   overhead over eager {us - eager:6.2f} us"
        )


if __name__ == "__main__":
    main()
