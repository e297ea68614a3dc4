"""litgpt training step (forward + backward) on a CUDA GPU: eager, torch.compile, thunder_core.

Each backend runs in a fresh process, backends interleaved over ``--rounds`` rounds. A step is
timed with the device synchronized before and after (median of ``--steps`` steps after two
warm-up steps). The first round's process of each backend also checks its gradients: one step in the benchmark's
dtype against eager's float32 step (``grad err``, the largest relative error over the parameters,
a missing gradient counting as 1), beside eager's own step in that dtype (``eager err``, what the
dtype's rounding alone makes), so a fast but wrong backend shows as such. The executors that
ran the thunder_core trace are printed beside it.

    python benchmarks/gpu_training_step.py                      # all backends, bf16, width 1024
    python benchmarks/gpu_training_step.py --rounds 2 --steps 20
    python benchmarks/gpu_training_step.py --backends "eager,thunder_core[torch+cudnn]"

Without a CUDA device it says so and exits with status 0. Backend names are those of
``benchmarks/backends.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BACKENDS = ("eager", "torch.compile", "thunder_core[torch]", "thunder_core")
SIZES = {
    "default": {"batch": 8, "length": 1024, "width": 1024, "layers": 8, "heads": 16, "vocab": 32000},
    "small": {"batch": 2, "length": 64, "width": 128, "layers": 2, "heads": 4, "vocab": 1024},  # a dry run
}
SIZE = dict(SIZES["default"])
DEVICE = "cuda"


def build_model(dtype):
    """litgpt GPT (Llama-style: RMSNorm, SwiGLU MLP, rotary), random weights, on the GPU."""
    import torch
    from litgpt.config import Config
    from litgpt.model import GPT

    torch.manual_seed(0)
    config = Config(
        name="gpu-bench", block_size=SIZE["length"], vocab_size=SIZE["vocab"], padded_vocab_size=SIZE["vocab"],
        n_layer=SIZE["layers"], n_head=SIZE["heads"], n_query_groups=SIZE["heads"], n_embd=SIZE["width"],
        intermediate_size=4 * SIZE["width"], bias=False,
        norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
    )  # fmt: skip
    return GPT(config).to(device=DEVICE, dtype=dtype)


def _tokens(batch: int, length: int, seed: int):
    import torch

    generator = torch.Generator(DEVICE).manual_seed(seed)
    return torch.randint(0, SIZE["vocab"], (batch, length), device=DEVICE, generator=generator)


def _synchronize() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def loss_of(model, idx):
    import torch

    logits = model(idx[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1)
    )


def _gradients(model, run, idx) -> tuple[float, dict]:
    """The loss of ``run`` (``model`` as a backend runs it) and the gradients it leaves on ``model``
    (None where it left none)."""
    for p in model.parameters():
        p.grad = None
    loss = loss_of(run, idx)
    loss.backward()
    return loss.item(), {
        n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()
    }


def _error(actual: dict, reference: dict) -> float:
    """The largest relative error over the parameters; a missing gradient counts as 1."""
    return max(
        1.0 if actual.get(n) is None else (actual[n].float() - g).norm().item() / max(g.norm().item(), 1e-30)
        for n, g in reference.items()
    )


def check_against_eager(backend: str, dtype) -> dict:
    """One step of ``backend`` in ``dtype`` against eager's float32 step on the same weights and
    tokens, beside eager's own step in ``dtype`` (the error that dtype's rounding alone makes)."""
    import torch
    from backends import wrap

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 matrix products, not TF32
    torch.backends.cudnn.allow_tf32 = False
    idx = _tokens(2, min(SIZE["length"], 256) + 1, seed=1)
    reference = build_model(torch.float32)
    _, expected = _gradients(reference, reference, idx)
    expected = {n: g.float() for n, g in expected.items()}
    model = build_model(dtype)
    _, eager = _gradients(model, model, idx)
    _, actual = _gradients(model, wrap(model, backend), idx)
    return {"grad_error": _error(actual, expected), "eager_grad_error": _error(eager, expected)}


def measure(backend: str, steps: int, dtype_name: str, check: bool) -> dict:
    import torch
    from backends import wrap

    dtype = getattr(torch, dtype_name)
    model = build_model(dtype)
    idx = _tokens(SIZE["batch"], SIZE["length"] + 1, seed=0)

    def step():
        for p in model.parameters():
            p.grad = None
        loss = loss_of(wrapped, idx)
        loss.backward()
        return loss

    _synchronize()
    start = time.perf_counter()
    wrapped = wrap(model, backend)
    loss = step().item()
    first_call = time.perf_counter() - start
    step()
    times = []
    for _ in range(steps):
        _synchronize()
        begin = time.perf_counter()
        step()
        _synchronize()
        times.append(time.perf_counter() - begin)
    result = {
        "step_s": statistics.median(times),
        "first_call_s": first_call,
        "loss": loss,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0,
    }
    if backend.startswith("thunder_core"):
        import thunder_core

        result["executors"] = sorted({op.executor for op in thunder_core.explain(wrapped).operations})
    if check:
        result.update(check_against_eager(backend, dtype))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", help="measure one backend in this process (internal)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset to run")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every backend")
    parser.add_argument("--check", action="store_true", help="with --backend: also check against eager")
    parser.add_argument("--size", choices=SIZES, default="default", help="small: a quick dry run")
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of the script"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args()
    import torch

    global DEVICE
    DEVICE = args.device
    SIZE.update(SIZES[args.size])
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this benchmark measures GPU training steps; nothing to do")
        return
    if args.backend:
        print(json.dumps(measure(args.backend, args.steps, args.dtype, args.check)))
        return

    from measure import interleaved, round_ratios, run_isolated, spread

    backends = [b for b in args.backends.split(",") if b]
    if "eager" not in backends:
        backends.insert(0, "eager")
    checked: set[str] = set()

    def run_one(backend: str) -> dict:
        check = [] if backend in checked else ["--check"]  # the first round checks against eager
        checked.add(backend)
        try:
            result = run_isolated(
                __file__,
                "--backend",
                backend,
                "--steps",
                str(args.steps),
                "--dtype",
                args.dtype,
                "--size",
                args.size,
                "--device",
                args.device,
                *check,
            )
        except RuntimeError as error:
            print(f"  {backend} failed: {str(error)[-1500:]}", flush=True)
            raise
        print(f"  {backend}: {json.dumps(result)}", flush=True)  # what a run cut short still shows
        return result

    runs = interleaved(run_one, backends, args.rounds)
    device_name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    print(
        f"litgpt {SIZE['layers']} layers, width {SIZE['width']}, {SIZE['heads']} heads, vocab {SIZE['vocab']}: "
        f"training step, batch {SIZE['batch']} x {SIZE['length']} tokens, {args.dtype}, {device_name}, torch {torch.__version__}; step = median "
        f"(min-max) over {args.rounds} interleaved rounds, each in a fresh process, of the median of {args.steps} steps"
    )
    print(
        f"{'backend':28s} {'step ms':>22s} {'vs eager':>9s} {'first s':>8s} {'peak GiB':>9s} {'grad err':>9s} {'eager err':>9s}  executors"
    )
    eager = [r for r in runs["eager"] if "step_s" in r]
    for name, results in runs.items():
        ok = [r for r in results if "step_s" in r]
        if not ok:
            print(f"{name:28s} failed: {results[0].get('error')}")
            continue
        ratio = statistics.median(round_ratios(ok, eager, "step_s")) if eager else float("nan")
        print(
            f"{name:28s} {spread([r['step_s'] for r in ok], 1e3):>22s} {ratio:8.2f}x "
            f"{statistics.median(r['first_call_s'] for r in ok):8.1f} {ok[0]['peak_gib']:9.2f} "
            f"{max(r.get('grad_error', 0.0) for r in ok):9.1e} {max(r.get('eager_grad_error', 0.0) for r in ok):9.1e}  "
            f"{','.join(ok[0].get('executors', []))}"
        )
        for failed in (r for r in results if "error" in r):
            print(f"  one round failed: {failed['error']}")
    if "torch.compile" in runs:
        compiled = [r for r in runs["torch.compile"] if "step_s" in r]
        for name, results in runs.items():
            if name.startswith("thunder_core"):
                ratios = round_ratios(compiled, [r for r in results if "step_s" in r], "step_s")
                print(f"torch.compile / {name} per round: " + ", ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
