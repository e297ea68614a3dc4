"""Batch-1 generation with litgpt's KV cache: time to first token and decoding tokens/s.

For each backend, in its own process: prefill of a prompt, then greedy token-by-token decoding
through litgpt's own KV cache (``model.set_kv_cache``, ``model(idx, input_pos)``). Decoding is
memory-bound, so the floor printed beside the results is the weight bytes read per token divided
by the read bandwidth measured in the same run (summing a 256 MiB tensor: weights are only
read). The copy bandwidth (bytes read plus bytes written by a large copy, per second) is printed
too; on some machines it is far above what reading alone reaches. Every backend must produce
eager's tokens.

Backends run interleaved (A B C A B C ...) for ``--rounds`` rounds, each in a fresh process;
the table gives the median over rounds with the spread (fastest-slowest round) and the median of
the per-round ratios.

    python benchmarks/generate.py                  # the ~30M-parameter config (6 layers, width 512)
    python benchmarks/generate.py --config 4k      # the same with a 4096-token vocabulary
    python benchmarks/generate.py --config small   # 2 layers, width 128
    python benchmarks/generate.py --tokens 64 --backends eager,thunder_core --rounds 3

Backend names are those of ``benchmarks/backends.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BACKENDS = ("eager", "torch.compile", "thunder_core[torch]", "thunder_core")
CONFIGS = {
    "30m": {
        "n_layer": 6,
        "n_embd": 512,
        "n_head": 8,
        "n_query_groups": 8,
        "intermediate_size": 1376,
        "vocab": 8192,
    },
    "4k": {
        "n_layer": 6,
        "n_embd": 512,
        "n_head": 8,
        "n_query_groups": 8,
        "intermediate_size": 1376,
        "vocab": 4096,
    },
    "small": {
        "n_layer": 2,
        "n_embd": 128,
        "n_head": 4,
        "n_query_groups": 4,
        "intermediate_size": 344,
        "vocab": 2048,
    },
}
PROMPT = 32


def build_model(name: str):
    import torch
    from litgpt.config import Config
    from litgpt.model import GPT

    c = CONFIGS[name]
    torch.manual_seed(0)
    config = Config(
        name=f"bench-{name}", block_size=512, vocab_size=c["vocab"], padded_vocab_size=c["vocab"],
        n_layer=c["n_layer"], n_head=c["n_head"], n_query_groups=c["n_query_groups"], n_embd=c["n_embd"],
        intermediate_size=c["intermediate_size"], bias=False, norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
    )  # fmt: skip
    return GPT(config).eval()


def generate(model, prompt, steps: int) -> tuple[list[int], float, list[float]]:
    import torch

    model.set_kv_cache(batch_size=1)
    start = time.perf_counter()
    input_pos = torch.arange(0, prompt.shape[1])
    logits = model(prompt, input_pos)
    token = logits[:, -1].argmax(-1, keepdim=True)
    first = time.perf_counter() - start
    tokens, times = [int(token)], []
    for _ in range(steps - 1):
        input_pos = input_pos[-1:] + 1
        start = time.perf_counter()
        logits = model(token, input_pos)
        token = logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - start)
        tokens.append(int(token))
    return tokens, first, times


def measure(backend: str, config: str, steps: int) -> dict:
    import torch

    torch.set_grad_enabled(False)
    model = build_model(config)
    prompt = torch.randint(
        0, CONFIGS[config]["vocab"], (1, PROMPT), generator=torch.Generator().manual_seed(0)
    )
    from backends import wrap
    from measure import finish_background_compiles

    start = time.perf_counter()
    wrapped = wrap(model, backend)
    tokens, first_cold, _ = generate(wrapped, prompt, 4)  # compiles prefill and decode
    warmup = time.perf_counter() - start
    finish_background_compiles()
    runs = [generate(wrapped, prompt, steps) for _ in range(3)]
    decode = statistics.median(t for _, _, times in runs for t in times)
    return {
        "backend": backend,
        "tokens": runs[0][0],
        "first_call_s": warmup,
        "ttft_s": statistics.median(first for _, first, _ in runs),
        "decode_s": decode,
    }


def floor(config: str) -> dict:
    """Weight bytes per decoded token, this machine's read and copy bandwidths, and the floor."""
    import torch

    model = build_model(config)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def median_time(fn) -> float:
        fn()
        times = []
        for _ in range(20):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    src = torch.empty(64 * 2**20 // 4)
    dst = torch.empty_like(src)
    copy_bandwidth = 2 * src.numel() * 4 / median_time(lambda: dst.copy_(src))  # read + write
    big = torch.ones(256 * 2**20 // 4)
    read_bandwidth = big.numel() * 4 / median_time(big.sum)
    return {
        "weight_bytes": weight_bytes,
        "bandwidth": read_bandwidth,
        "copy_bandwidth": copy_bandwidth,
        "floor_s": weight_bytes / read_bandwidth,
    }


def collect(backends, config: str, tokens: int, rounds: int) -> tuple[dict, dict]:
    """The floor, and each backend's runs: interleaved rounds, each in a fresh process."""
    from measure import interleaved, run_isolated

    limit = floor(config)
    runs = interleaved(
        lambda b: run_isolated(__file__, "--backend", b, "--config", config, "--tokens", str(tokens)),
        [b for b in backends if b],
        rounds,
    )
    return limit, runs


def report(limit: dict, runs: dict, config: str, tokens: int, rounds: int) -> list[str]:
    """The table: tokens/s median (spread) per backend, ratios per round, tokens against eager's."""
    from measure import round_ratios, spread

    lines = [
        f"litgpt {config} ({limit['weight_bytes'] / 1e6:.0f} MB of float32 weights), batch 1, prompt {PROMPT}, "
        f"{tokens} tokens, {rounds} interleaved rounds; read bandwidth {limit['bandwidth'] / 1e9:.1f} GB/s "
        f"-> floor {limit['floor_s'] * 1e3:.2f} ms/token ({1 / limit['floor_s']:.0f} tokens/s)",
        f"  {'backend':24s} {'tokens/s median (spread)':>26s} {'x eager':>18s} {'x torch.compile':>18s} "
        f"{'first token ms':>20s} {'first call s':>18s}",
    ]
    eager = [r for r in runs.get("eager", []) if "decode_s" in r]
    compiled = [r for r in runs.get("torch.compile", []) if "decode_s" in r]
    for backend, results in runs.items():
        ok = [r for r in results if "decode_s" in r]
        errors = [r["error"] for r in results if "error" in r]
        if not ok:
            lines.append(f"  {backend:24s} failed: {errors[0] if errors else 'no result'}")
            continue
        speeds = [1 / r["decode_s"] for r in ok]
        x_eager = round_ratios(eager, ok, "decode_s") if eager else []
        x_compile = round_ratios(compiled, ok, "decode_s") if compiled else []
        same = all(r["tokens"] == e["tokens"] for r, e in zip(ok, eager))
        lines.append(
            f"  {backend:24s} {spread(speeds):>26s} {spread(x_eager, digits=2):>18s} "
            f"{spread(x_compile, digits=2):>18s} {spread([r['ttft_s'] for r in ok], 1e3):>20s} "
            f"{spread([r['first_call_s'] for r in ok]):>18s}"
            + ("" if same else "  TOKENS DIFFER FROM EAGER")
            + (f"  ({len(errors)} round(s) failed: {errors[0]})" if errors else "")
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="30m")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--backend", help="measure one backend in this process (internal)")
    args = parser.parse_args()
    if args.backend:
        import json

        print(json.dumps(measure(args.backend, args.config, args.tokens)))
        return
    limit, runs = collect(args.backends.split(","), args.config, args.tokens, args.rounds)
    print("\n".join(report(limit, runs, args.config, args.tokens, args.rounds)))


if __name__ == "__main__":
    main()
