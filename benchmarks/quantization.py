"""Batch-1 decoding with weight-only int8 / int4 quantization against float32.

    python benchmarks/quantization.py [--config 30m] [--tokens 32]

The litgpt model and the decoding loop of ``generate.py`` (prefill of a 32-token prompt, then
one token at a time through litgpt's KV cache). Each backend runs in a fresh process: float32
eager, torch.compile and thunder_core, then thunder_core with ``quantize-int8`` and
``quantize-int4`` (the LM head stays float32, as the plugins do by default). Prints tokens/s,
ratios against float32 eager and torch.compile measured in the same run, the weight bytes
each reads per token, and how many greedy tokens agree with float32 eager.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from generate import CONFIGS, collect  # noqa: E402

BACKENDS = [
    "eager",
    "torch.compile",
    "thunder_core",
    "thunder_core/quantize-int8",
    "thunder_core/quantize-int4",
]


def weight_megabytes(config: str) -> dict[str, float]:
    """Bytes of the weights per format: the linear layers but the LM head at 1 or 0.5 byte plus scales."""
    from generate import build_model
    from torch import nn

    model = build_model(config)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    linear = sum(
        m.weight.numel() for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"
    )
    rows = sum(
        m.weight.shape[0] for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"
    )
    rest = total - 4 * linear
    return {
        "float32": total / 1e6,
        "int8": (rest + linear + 4 * rows) / 1e6,
        "int4": (rest + linear / 2 + linear / 64 * 2 * 4) / 1e6,
    }


def main() -> None:
    from measure import round_ratios, spread

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="30m")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    limit, runs = collect(BACKENDS, args.config, args.tokens, args.rounds)
    sizes = weight_megabytes(args.config)
    eager = [r for r in runs["eager"] if "decode_s" in r]
    compiled = [r for r in runs["torch.compile"] if "decode_s" in r]
    print(f"litgpt {args.config}, batch 1, {args.tokens} tokens, {args.rounds} interleaved rounds; float32 floor "
          f"{limit['floor_s'] * 1e3:.2f} ms/token (read bandwidth {limit['bandwidth'] / 1e9:.1f} GB/s); "
          "tokens/s and ratios: median (spread)")  # fmt: skip
    for backend, results in runs.items():
        ok = [r for r in results if "decode_s" in r]
        if not ok:
            print(f"  {backend:30s} failed: {results[0].get('error')}")
            continue
        kind = backend.rpartition("quantize-")[2] if "quantize-" in backend else "float32"
        agree = min(sum(a == b for a, b in zip(r["tokens"], e["tokens"])) for r, e in zip(ok, eager))
        print(
            f"  {backend:30s} {spread([1 / r['decode_s'] for r in ok])} tokens/s; {sizes[kind]:5.1f} MB of weights; "
            f"{spread(round_ratios(eager, ok, 'decode_s'), digits=2)}x float32 eager, "
            f"{spread(round_ratios(compiled, ok, 'decode_s'), digits=2)}x torch.compile; "
            f"greedy tokens equal to float32 eager: {agree}/{len(ok[0]['tokens'])}"
        )


if __name__ == "__main__":
    main()
