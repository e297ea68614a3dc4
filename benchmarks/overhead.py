"""Cached per-call overhead: ``a + b`` on small tensors, and a small litgpt forward.

Eager, torch.compile and thunder_core, measured in the same run; prints microseconds per
call (median of repeated timings) and each backend's ratio to eager. thunder_core checks its
guards on every call (the Python values the trace was specialized on); its
``cache="same input"`` line shows the same call without them, so their cost is visible.

    python benchmarks/overhead.py
"""

from __future__ import annotations

import statistics
import timeit

import torch

import thunder_core


def per_call_us(fn, *args, number: int = 20000, repeat: int = 15) -> float:
    for _ in range(100):
        fn(*args)
    times = timeit.repeat(lambda: fn(*args), number=number, repeat=repeat)
    return statistics.median(times) / number * 1e6


def _report(title: str, results: dict[str, float]) -> None:
    eager = results["eager"]
    print(title)
    for name, us in results.items():
        print(
            f"  {name:26s} {us:9.2f} us/call   {us / eager:5.2f}x eager   overhead over eager {us - eager:8.2f} us"
        )


def litgpt_forward() -> None:
    """The cached call of a 4-layer litgpt forward (tiny widths, so the framework's cost shows)."""
    from thunder_core.testing.models import small_litgpt

    torch.manual_seed(0)
    model = small_litgpt(n_layer=4, n_embd=32, vocab=64, block_size=16).eval()
    idx = torch.randint(0, 64, (1, 8))
    backends = {
        "eager": model,
        "torch.compile": torch.compile(model),
        "thunder_core (guarded)": thunder_core.jit(model, executors=["torch"]),
        "thunder_core (same input)": thunder_core.jit(model, executors=["torch"], cache="same input"),
        "torch.compile(thunder_core)": torch.compile(
            model, backend="thunder_core", options={"executors": ["torch"]}
        ),
    }
    with torch.no_grad():
        for fn in backends.values():
            torch.testing.assert_close(fn(idx), model(idx))
        results = {name: per_call_us(fn, idx, number=200, repeat=9) for name, fn in backends.items()}
    guard = backends["thunder_core (guarded)"]._forward.last_compiled().guard
    _report(
        f"cached call of a 4-layer litgpt forward, 1x8 tokens, torch executor ({len(guard)} guard checks)",
        results,
    )


def main() -> None:
    torch.set_num_threads(1)
    a, b = torch.randn(4, 4), torch.randn(4, 4)

    def add(a, b):
        return a + b

    backends = {
        "eager": add,
        "torch.compile": torch.compile(add),
        "thunder_core": thunder_core.jit(add),
        "thunder_core (same input)": thunder_core.jit(add, cache="same input"),
        "torch.compile(thunder_core)": torch.compile(add, backend="thunder_core"),
    }
    for fn in backends.values():
        torch.testing.assert_close(fn(a, b), a + b)
    results = {name: per_call_us(fn, a, b) for name, fn in backends.items()}
    _report(f"cached call of `a + b` on 4x4 float32 tensors (torch {torch.__version__})", results)
    litgpt_forward()


if __name__ == "__main__":
    main()
