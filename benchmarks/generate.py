"""Batch-1 generation with litgpt's KV cache: time to first token and decoding tokens/s.

For each backend, in its own process: prefill of a prompt, then greedy token-by-token decoding
through litgpt's own KV cache (``model.set_kv_cache``, ``model(idx, input_pos)``). Decoding is
memory-bound, so the floor printed beside the results is the weight bytes read per token divided
by the read bandwidth measured in the same run (summing a 256 MiB tensor: weights are only
read). The copy bandwidth (bytes read plus bytes written by a large copy, per second) is printed
too; on some machines it is far above what reading alone reaches. Every backend must produce
eager's tokens.

    python benchmarks/generate.py                  # the ~30M-parameter config (6 layers, width 512)
    python benchmarks/generate.py --config small   # 2 layers, width 128
    python benchmarks/generate.py --tokens 64 --backends eager,thunder_core
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BACKENDS = (
    "eager",
    "torch.compile",
    "torch.compile(max-autotune-no-cudagraphs)",
    "thunder_core[torch]",
    "thunder_core",
    "torch.compile(backend=thunder_core)",
)
CONFIGS = {
    "30m": {
        "n_layer": 6,
        "n_embd": 512,
        "n_head": 8,
        "n_query_groups": 8,
        "intermediate_size": 1376,
        "vocab": 8192,
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


def wrap(model, backend: str):
    import torch

    if backend == "eager":
        return model
    if backend == "torch.compile":
        return torch.compile(model)
    if backend == "torch.compile(max-autotune-no-cudagraphs)":
        return torch.compile(model, mode="max-autotune-no-cudagraphs")
    if backend == "torch.compile(backend=thunder_core)":
        return torch.compile(model, backend="thunder_core")
    import thunder_core

    backend, _, plugins = backend.partition("/")  # "thunder_core/quantize-int8": with that plugin
    executors = backend.removeprefix("thunder_core").strip("[]")
    return thunder_core.jit(
        model,
        executors=executors.split("+") if executors else None,
        plugins=plugins.split("+") if plugins else None,
    )


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
    start = time.perf_counter()
    wrapped = wrap(model, backend)
    tokens, first_cold, _ = generate(wrapped, prompt, 4)  # compiles prefill and decode
    warmup = time.perf_counter() - start
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


def collect(backends, config: str, tokens: int) -> tuple[dict, dict]:
    """The floor, and each backend measured in a fresh process (a failure is reported, not raised)."""
    from measure import run_isolated

    limit = floor(config)
    results = {}
    for backend in [b for b in backends if b]:
        try:
            results[backend] = run_isolated(__file__, "--backend", backend, "--config", config,
                                            "--tokens", str(tokens))  # fmt: skip
        except Exception as error:  # noqa: BLE001 - a backend that fails is reported, the others still run
            results[backend] = {"error": f"{type(error).__name__}: {str(error)[-300:]}"}
    return limit, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="30m")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--backend", help="measure one backend in this process (internal)")
    args = parser.parse_args()
    if args.backend:
        import json

        print(json.dumps(measure(args.backend, args.config, args.tokens)))
        return
    limit, results = collect(args.backends.split(","), args.config, args.tokens)
    eager = results.get("eager", {})
    compiled = results.get("torch.compile", {})
    print(
        f"litgpt {args.config} ({limit['weight_bytes'] / 1e6:.0f} MB of float32 weights), batch 1, prompt {PROMPT}, "
        f"{args.tokens} tokens; read bandwidth {limit['bandwidth'] / 1e9:.1f} GB/s (copy: "
        f"{limit['copy_bandwidth'] / 1e9:.1f} GB/s read + written) -> floor "
        f"{limit['floor_s'] * 1e3:.2f} ms/token ({1 / limit['floor_s']:.0f} tokens/s)"
    )
    for backend, r in results.items():
        if "error" in r:
            print(f"  {backend:42s} failed: {r['error']}")
            continue
        same = "" if not eager or r["tokens"] == eager.get("tokens") else "  TOKENS DIFFER FROM EAGER"
        line = (
            f"  {backend:42s} {1 / r['decode_s']:7.1f} tokens/s ({r['decode_s'] * 1e3:6.2f} ms, "
            f"{r['decode_s'] / limit['floor_s']:.2f}x floor"
        )
        if eager:
            line += f", {eager['decode_s'] / r['decode_s']:.2f}x eager"
        if compiled and "decode_s" in compiled:
            line += f", {compiled['decode_s'] / r['decode_s']:.2f}x torch.compile"
        line += f"); first token {r['ttft_s'] * 1e3:.1f} ms; first call {r['first_call_s']:.1f} s{same}"
        print(line)


if __name__ == "__main__":
    main()
