"""Functional transforms: torch.func eagerly, torch.compile of the same torch.func program, and
thunder_core's transforms compiled by ``thunder_core.jit`` (one trace each), on the CPU.

    python benchmarks/functional.py [--rounds 3] [--cases mlp-grad hvp block-grad mlp-per-sample wide-mlp-per-sample block-per-sample ensemble]

Cases:

- ``mlp-grad``: the gradient of an MLP's loss (512 -> 1024 -> 512, batch 64) with respect to
  its parameters, given as a dict (``grad(loss)(params, x, y)``);
- ``hvp``: a Hessian-vector product of that loss (with tanh and a written-out squared error:
  torch.func's forward-over-reverse fails on gelu and mse_loss) with respect to the first weight
  matrix, forward-over-reverse (``jvp(grad(f), (w,), (v,))``);
- ``block-grad``: the gradient of a litgpt transformer block (width 256, 4 heads, batch 8 x 128
  tokens) with respect to its parameters through ``torch.func.functional_call``;
- ``mlp-per-sample``: per-sample gradients of a small MLP's loss (784 -> 128 -> 10, MNIST-sized),
  64 examples (``vmap(grad(loss), in_dims=(None, 0, 0))``);
- ``wide-mlp-per-sample``: the same for the 512 -> 1024 -> 512 MLP (64 copies of its 1M
  parameters, 256 MB written per step);
- ``block-per-sample``: per-sample gradients of the litgpt block's parameters, 64 examples of 32
  tokens;
- ``ensemble``: 8 MLPs with their parameters stacked (``torch.func.stack_module_state``), each run
  on the same batch of 64 (``vmap(run, in_dims=(0, None))``).

Each backend runs in a fresh process (results checked against eager torch.func's), backends
interleaved round after round; printed: the median step time with its spread over rounds and the
per-round ratios against eager torch.func and torch.compile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from measure import interleaved, median_seconds, round_ratios, run_isolated, spread  # noqa: E402

CASES = [
    "mlp-grad",
    "hvp",
    "block-grad",
    "mlp-per-sample",
    "wide-mlp-per-sample",
    "block-per-sample",
    "ensemble",
]
BACKENDS = ["torch.func", "torch.compile", "thunder_core"]


def _mlp(widths=(512, 1024, 512)):
    import torch

    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator) / shape[0] ** 0.5

    inputs, hidden, outputs = widths
    params = {"w1": randn(inputs, hidden), "b1": randn(hidden), "w2": randn(hidden, outputs)}
    x, y = torch.randn(64, inputs, generator=generator), torch.randn(64, outputs, generator=generator)

    def loss(params, x, y):
        hidden = torch.nn.functional.gelu(x @ params["w1"] + params["b1"])
        return torch.nn.functional.mse_loss(hidden @ params["w2"], y)

    def smooth_loss(params, x, y):  # torch.func's forward-over-reverse fails on gelu/mse_loss (ZeroTensor)
        hidden = torch.tanh(x @ params["w1"] + params["b1"])
        return ((hidden @ params["w2"] - y) ** 2).mean()

    return params, x, y, loss, smooth_loss


def _program(case: str, transforms):
    """(function, arguments) of ``case`` written with ``transforms`` (torch.func or thunder_core)."""
    import torch

    if case == "mlp-grad":
        params, x, y, loss, _ = _mlp()
        return (lambda params, x, y: transforms.grad(loss)(params, x, y)), (params, x, y)
    if case == "hvp":
        params, x, y, _, smooth_loss = _mlp()

        def f(w1):
            return smooth_loss({**params, "w1": w1}, x, y)

        v = torch.randn_like(params["w1"])
        return (lambda w, v: transforms.jvp(transforms.grad(f), (w,), (v,))[1]), (params["w1"], v)
    if case in ("mlp-per-sample", "wide-mlp-per-sample"):
        params, x, y, loss, _ = _mlp((784, 128, 10) if case == "mlp-per-sample" else (512, 1024, 512))
        per_sample = transforms.vmap(transforms.grad(loss), in_dims=(None, 0, 0))
        return (lambda params, x, y: per_sample(params, x, y)), (params, x, y)
    if case == "ensemble":
        return _ensemble(transforms)
    from thunder_core.testing.models import small_litgpt

    torch.manual_seed(0)
    model = small_litgpt(n_layer=1, n_embd=256, vocab=256, block_size=128)
    block = model.transformer.h[0]
    params = {name: p.detach() for name, p in block.named_parameters()}
    length = 32 if case == "block-per-sample" else 128
    x = torch.randn(64 if case == "block-per-sample" else 8, length, 256)
    cos, sin = model.cos[:length].unsqueeze(0), model.sin[:length].unsqueeze(0)

    def loss(params, x):
        return torch.func.functional_call(block, params, (x, cos, sin)).pow(2).mean()

    if case == "block-per-sample":

        def loss_of_one(params, example):
            return loss(params, example.unsqueeze(0))

        per_sample = transforms.vmap(transforms.grad(loss_of_one), in_dims=(None, 0))
        return (lambda params, x: per_sample(params, x)), (params, x)
    return (lambda params, x: transforms.grad(loss)(params, x)), (params, x)


def _ensemble(transforms):
    import torch

    torch.manual_seed(0)
    members = [
        torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
        for _ in range(8)
    ]
    stacked, _ = torch.func.stack_module_state(members)
    stacked = {name: p.detach() for name, p in stacked.items()}
    base = members[0].to("meta")
    x = torch.randn(64, 512)

    def run(params, x):
        return torch.func.functional_call(base, params, (x,))

    ensemble = transforms.vmap(run, in_dims=(0, None))
    return (lambda params, x: ensemble(params, x)), (stacked, x)


def worker(case: str, backend: str) -> None:
    import torch

    import thunder_core

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    reference, args = _program(case, torch.func)
    expected = reference(*args)
    if backend == "torch.func":
        fn = reference
    elif backend == "torch.compile":
        fn = torch.compile(_program(case, torch.func)[0])
    else:
        fn = thunder_core.jit(_program(case, thunder_core)[0])
    torch.testing.assert_close(fn(*args), expected, rtol=1e-4, atol=1e-5)
    seconds = median_seconds(lambda: fn(*args), warmup=2, repeats=10)
    print(json.dumps({"step_s": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=CASES, choices=CASES)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    print(
        f"functional transforms, CPU, {os.cpu_count()} cores; {args.rounds} rounds, each backend in a fresh process"
    )
    print(
        f"{'case':20s} {'backend':14s} {'ms, median (spread)':>24s} {'vs torch.func':>14s} {'vs compile':>11s}"
    )
    for case in args.cases:
        runs = interleaved(
            lambda backend, case=case: run_isolated(__file__, "--worker", case, backend),
            BACKENDS,
            args.rounds,
        )
        for backend in BACKENDS:
            ok = [r for r in runs[backend] if "step_s" in r]
            if not ok:
                print(f"{case:20s} {backend:14s}  failed: {runs[backend][0].get('error')}")
                continue
            eager = statistics.median(
                round_ratios(runs["torch.func"], runs[backend], "step_s") or [float("nan")]
            )
            compiled = statistics.median(
                round_ratios(runs["torch.compile"], runs[backend], "step_s") or [float("nan")]
            )
            times = spread([r["step_s"] for r in ok], 1e3)
            print(f"{case:20s} {backend:14s} {times:>24s} {eager:13.2f}x {compiled:10.2f}x", flush=True)


if __name__ == "__main__":
    main()
