"""thunder_core demo: jit a small GPT, print its final trace, and time it against eager."""

from __future__ import annotations

import time

import torch
from litgpt.config import Config
from litgpt.model import GPT

import thunder_core


def median_ms(fn, *args, repeats: int = 20) -> float:
    for _ in range(3):  # warm up thread pools and allocator
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    torch.manual_seed(0)
    config = Config(
        name="demo", block_size=128, vocab_size=512, padded_vocab_size=512, n_layer=2, n_head=4,
        n_query_groups=2, n_embd=128, intermediate_size=512, bias=False, norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
    )  # fmt: skip
    model = GPT(config).eval()
    idx = torch.randint(0, 512, (4, 128))

    jmodel = thunder_core.jit(model)
    start = time.perf_counter()
    with torch.no_grad():
        out = jmodel(idx)
    first_call = time.perf_counter() - start
    with torch.no_grad():
        torch.testing.assert_close(out, model(idx))

    final = thunder_core.last_traces(jmodel)[-1]
    print(final.python(subsymbol_depth=0))
    with torch.no_grad():
        eager = median_ms(model, idx)
        jitted = median_ms(jmodel, idx)
    info = thunder_core.cache_info(jmodel)
    explanation = thunder_core.explain(jmodel)
    print(f"executors (installed and available, in claim order): {', '.join(explanation.executors)}")
    print(f"first call (capture + compiling the executors' kernels): {first_call * 1e3:.0f} ms")
    print(
        f"forward, median of 20: eager {eager:.2f} ms, thunder_core {jitted:.2f} ms ({eager / jitted:.2f}x eager)"
    )
    print(f"cache: {info.hits} hits, {info.misses} misses, {info.entries} entries")


if __name__ == "__main__":
    main()
