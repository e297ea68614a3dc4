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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="30m")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    limit, results = collect(BACKENDS, args.config, args.tokens)
    sizes = weight_megabytes(args.config)
    eager, compiled = results.get("eager", {}), results.get("torch.compile", {})
    print(f"litgpt {args.config}, batch 1, {args.tokens} tokens; float32 floor {limit['floor_s'] * 1e3:.2f} ms/token "
          f"(read bandwidth {limit['bandwidth'] / 1e9:.1f} GB/s)")  # fmt: skip
    for backend, r in results.items():
        if "error" in r:
            print(f"  {backend:30s} failed: {r['error']}")
            continue
        kind = backend.rpartition("quantize-")[2] if "quantize-" in backend else "float32"
        agree = sum(a == b for a, b in zip(r["tokens"], eager.get("tokens", [])))
        line = f"  {backend:30s} {1 / r['decode_s']:7.1f} tokens/s ({r['decode_s'] * 1e3:6.2f} ms; {sizes[kind]:5.1f} MB of weights"
        if "decode_s" in eager:
            line += f"; {eager['decode_s'] / r['decode_s']:.2f}x float32 eager"
        if "decode_s" in compiled:
            line += f", {compiled['decode_s'] / r['decode_s']:.2f}x torch.compile"
        line += f"); greedy tokens equal to float32 eager: {agree}/{len(r['tokens'])}"
        print(line)


if __name__ == "__main__":
    main()
