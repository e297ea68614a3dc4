"""litgpt 4-layer training step (forward + backward) on CPU: eager, torch.compile, thunder_core.

torch.compile runs with its default backend (Inductor) and with ``backend="thunder_core"``;
``thunder_core[...]/checkpoint`` adds the activation-checkpointing plugin (policy ``blocks``).

For each backend, in its own process: the first call (wrapping the model, capture/compile
and one step; compile caches on disk as earlier runs left them), the median step time, the
page faults per step while timing (memory the C library gave back and had to map again), and
the peak memory one step adds: ``peak MB``, the growth of the resident set (what the operating
system sees, which moves by a few MB between runs with the heap's layout), and ``live MB``, the
peak bytes of live tensors (the profiler's memory timeline: the same in every run of the same
program). Ratios are against eager measured in the same run.

    python benchmarks/training_step.py --what live --backend thunder_core --model llama

prints what is alive at one backend's peak, by where it was allocated.

    python benchmarks/training_step.py            # all backends
    python benchmarks/training_step.py --steps 20
    python benchmarks/training_step.py --cold     # also the first call with empty compile caches
    python benchmarks/training_step.py --model llama   # transformers' LlamaForCausalLM instead
    python benchmarks/training_step.py --backends "torch.compile,thunder_core[inductor(regions=maximal)]"

Backend names are those of ``benchmarks/backends.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BACKENDS = (
    "eager",
    "torch.compile",
    "thunder_core[torch]",
    "thunder_core",
)
BATCH, LENGTH = 4, 256


MODELS = ("litgpt", "llama")


def build_model(name: str = "litgpt", block_size: int = LENGTH):
    """litgpt GPT, or transformers' LlamaForCausalLM: 4 layers, width 256, random weights,
    for sequences of up to ``block_size`` tokens."""
    import torch

    torch.manual_seed(0)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=2048, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=block_size, use_cache=False,
        )  # fmt: skip
        return LlamaForCausalLM(config)
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(
        name="bench-4-layer", block_size=block_size, vocab_size=2048, padded_vocab_size=2048, n_layer=4,
        n_head=8, n_query_groups=8, n_embd=256, intermediate_size=1024, bias=False,
        norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
    )  # fmt: skip
    return GPT(config)


def loss_of(model, idx, name: str):
    import torch

    if name == "llama":
        return model(idx[:, :-1], labels=idx[:, :-1]).loss
    logits = model(idx[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def step_of(model, idx, name: str):
    """One training step of ``model`` on ``idx`` (gradients reset, loss backpropagated), returning the loss."""

    def step():
        for p in model.parameters():
            p.grad = None
        loss = loss_of(model, idx, name)
        loss.backward()
        return loss

    return step


def measure(backend: str, steps: int, what: str, name: str = "litgpt") -> dict:
    import torch
    from backends import wrap
    from measure import live_tensor_peak, median_seconds, peak_memory_bytes

    model = build_model(name)
    idx = torch.randint(0, 2048, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()  # the first call counts wrapping too: torch.compile's is lazy
    model = wrap(model, backend)
    step = step_of(model, idx, name)
    loss = step().item()
    first_call = time.perf_counter() - start
    if what == "memory":
        step()
        peak = peak_memory_bytes(step)
        live_peak, at_peak = live_tensor_peak(step)
        return {"peak_bytes": peak, "live_peak_bytes": live_peak, "at_peak": at_peak}
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step_time = median_seconds(step, repeats=steps)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) / (steps + 2)
    return {
        "backend": backend,
        "first_call_s": first_call,
        "step_s": step_time,
        "loss": loss,
        "faults_per_step": faults,
    }


def matmul_floor(name: str = "litgpt") -> dict:
    """The step's FLOPs and this machine's GEMM throughput (2048^3 matmul), hence the floor."""
    import torch
    from measure import median_seconds
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(name)
    idx = torch.randint(0, 2048, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        loss_of(model, idx, name).backward()
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    gemm = 2 * 2048**3 / median_seconds(lambda: a @ b, repeats=10)
    flops = counter.get_total_flops()
    return {
        "flops": flops,
        "gemm_flops_per_s": gemm,
        "floor_s": flops / gemm,
        **_fixed_kernels(model, idx, name),
    }


def _fixed_kernels(model, idx, name: str) -> dict:
    """Time per eager step in the GEMM and attention kernels, which every backend here calls as they are."""
    from torch.profiler import ProfilerActivity, profile

    step = step_of(model, idx, name)
    for _ in range(2):
        step()
    steps = 5
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    totals = {"gemm_s": 0.0, "attention_s": 0.0}
    for event in prof.key_averages():
        if event.key in ("aten::mm", "aten::addmm", "aten::bmm"):
            totals["gemm_s"] += event.self_cpu_time_total / 1e6 / steps
        elif "scaled_dot_product" in event.key and "flash_attention" in event.key:
            totals["attention_s"] += event.self_cpu_time_total / 1e6 / steps
    return totals


def _print_live(memory: dict) -> None:
    import collections

    groups = collections.Counter()
    for size, where in memory["at_peak"]:
        groups[(size, where)] += 1
    print(f"peak of live tensors {memory['live_peak_bytes'] / 2**20:.1f} MB; alive then, by where allocated:")
    for (size, where), count in sorted(groups.items(), key=lambda item: -item[0][0] * item[1]):
        if size * count >= 2**19:
            print(f"  {count:3d} x {size / 2**20:6.2f} MB = {count * size / 2**20:6.1f} MB  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", help="measure one backend in this process (internal)")
    parser.add_argument("--model", choices=MODELS, default="litgpt")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repetitions of every backend")
    parser.add_argument(
        "--what",
        choices=("time", "memory", "floor", "live"),
        default="time",
        help="with --backend: what to measure in this process (live: print what is alive at the peak)",
    )
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset to run")
    parser.add_argument(
        "--cold", action="store_true", help="also time each first call with empty Inductor and Numba caches"
    )
    args = parser.parse_args()
    if args.what == "floor":
        print(json.dumps(matmul_floor(args.model)))
        return
    if args.backend and args.what == "live":
        _print_live(measure(args.backend, args.steps, "memory", args.model))
        return
    if args.backend:
        print(json.dumps(measure(args.backend, args.steps, args.what, args.model)))
        return

    import statistics

    from measure import run_isolated

    backends = [b for b in args.backends.split(",") if b]
    if "eager" not in backends:  # every ratio is against eager measured in the same run
        backends.insert(0, "eager")
    floors = []
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    for _ in range(args.rounds):  # interleaved, so that machine noise hits every backend alike
        floors.append(run_isolated(__file__, "--what", "floor", "--model", args.model))
        for b in backends:
            runs[b].append(
                run_isolated(__file__, "--backend", b, "--steps", str(args.steps), "--model", args.model)
            )
    floor = {key: statistics.median(f[key] for f in floors) for key in floors[0]}
    results = {}
    for b in backends:
        results[b] = {
            "step_s": statistics.median(r["step_s"] for r in runs[b]),
            "rounds_s": [r["step_s"] for r in runs[b]],
            "first_call_s": statistics.median(r["first_call_s"] for r in runs[b]),
            "faults_per_step": statistics.median(r["faults_per_step"] for r in runs[b]),
            "loss": runs[b][0]["loss"],
        }
        results[b].update(
            run_isolated(__file__, "--backend", b, "--what", "memory", "--model", args.model, for_memory=True)
        )
        if args.cold:
            with tempfile.TemporaryDirectory() as caches:
                cold = {"TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor", "NUMBA_CACHE_DIR": f"{caches}/numba"}
                run = run_isolated(__file__, "--backend", b, "--steps", "1", "--model", args.model, env=cold)
            results[b]["cold_first_call_s"] = run["first_call_s"]
    eager = results["eager"]
    print(
        f"{args.model} 4-layer training step, batch {BATCH} x {LENGTH} tokens, CPU; step = median over "
        f"{args.rounds} interleaved rounds of the median of {args.steps} steps"
    )
    print(
        f"matmul floor (median of {args.rounds} rounds): {floor['flops'] / 1e9:.1f} GFLOP at {floor['gemm_flops_per_s'] / 1e9:.0f} GFLOP/s "
        f"(2048^3 GEMM) = {floor['floor_s'] * 1e3:.0f} ms"
    )
    fixed = floor["gemm_s"] + floor["attention_s"]
    print(
        f"eager's GEMM kernels {floor['gemm_s'] * 1e3:.0f} ms + flash-attention kernels "
        f"{floor['attention_s'] * 1e3:.0f} ms = {fixed * 1e3:.0f} ms ({fixed / floor['floor_s']:.2f}x floor): "
        "every backend calls these same kernels"
    )
    cold_header = f" {'cold first s':>13s}" if args.cold else ""
    print(
        f"{'backend':30s} {'step ms':>8s} {'vs eager':>9s} {'vs floor':>9s} {'first call s':>13s} "
        f"{'peak MB':>8s} {'live MB':>8s} {'faults/step':>12s}{cold_header}"
    )
    for name, r in results.items():
        cold = f" {r['cold_first_call_s']:13.2f}" if args.cold else ""
        print(
            f"{name:30s} {r['step_s'] * 1e3:8.1f} {r['step_s'] / eager['step_s']:8.2f}x "
            f"{r['step_s'] / floor['floor_s']:8.2f}x {r['first_call_s']:13.2f} {r['peak_bytes'] / 2**20:8.1f} "
            f"{r['live_peak_bytes'] / 2**20:8.1f} {r['faults_per_step']:12.0f}{cold}"
        )
    print("step ms per round (the spread):")
    for name, r in results.items():
        print(f"  {name:28s} " + "  ".join(f"{t * 1e3:6.1f}" for t in r["rounds_s"]))
    if "torch.compile" in results:
        reference = results["torch.compile"]["rounds_s"]
        for name, r in results.items():
            if name.startswith("thunder_core"):
                ratios = [c / t for c, t in zip(reference, r["rounds_s"])]
                print(
                    f"torch.compile / {name} per round: "
                    + ", ".join(f"{x:.3f}" for x in ratios)
                    + f" (faster in {sum(x > 1 for x in ratios)} of {len(ratios)} rounds)"
                )
    losses = {name: round(r["loss"], 5) for name, r in results.items()}
    print(f"first-step losses: {losses}")


if __name__ == "__main__":
    main()
