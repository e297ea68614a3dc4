"""First-call time: of ``a + b``, and against depth (a litgpt model's first training step), on CPU.

First, ``a + b`` on 4x4 tensors in a fresh process, timed from just after ``import torch`` (so
importing thunder_core counts) to its first result: eager, torch.compile, thunder_core with the
torch executor alone and with the default executors installed (median of ``--add-rounds``
fresh processes each). thunder_core also in a process after one that filled its disk cache:
with the default settings (it keeps operations' output metadata and measured executor choices)
and with ``THUNDER_CORE_CACHE_TRACES=1`` (captured traces too).

A transformer is N copies of one block; thunder_core compiles each distinct block once
(``reuse_blocks``, on by default), so most of the first call should not grow with depth. For
2, 8 and 24 layers (width 256, batch 4 x 256 tokens), each in a fresh process: eager (the
step itself, the floor any backend pays), torch.compile, thunder_core with its default
executors, with ``capture_blocks_once=True`` (a layer that would do what an earlier one did is
captured without running its Python) and with ``reuse_blocks=False``. "warm" runs with the compile caches
an earlier identical process left on disk (Inductor's and Numba's; thunder_core's own disk cache
empty); "cold" with empty Inductor and Numba caches; "disk" (thunder_core only) also with the
traces and executor choices an earlier identical process stored in thunder_core's disk cache
(``THUNDER_CORE_CACHE_DIR``, with ``THUNDER_CORE_CACHE_TRACES=1``).

    python benchmarks/compile_time.py                   # 2, 8, 24 layers, warm and cold
    python benchmarks/compile_time.py --layers 2,24 --rounds 3
    python benchmarks/compile_time.py --warm-only
    python benchmarks/compile_time.py --add-only --add-rounds 7   # the a + b table alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CAPTURE_ONCE = "thunder_core(capture_blocks_once=True)"
BACKENDS = ("eager", "torch.compile", "thunder_core", CAPTURE_ONCE, "thunder_core(reuse_blocks=False)")
ADD_BACKENDS = ("eager", "torch.compile", "thunder_core[torch]", "thunder_core")
# The same backend in a process after one that filled thunder_core's disk cache: with the default
# settings (output metadata and executor choices kept), and with its captured traces kept too.
SECOND_PROCESS = (" (disk cache warm)", " (disk cache warm, traces kept)")
BATCH, LENGTH, WIDTH = 4, 256, 256


def first_call(backend: str, layers: int) -> dict:
    import torch
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(
        name=f"bench-{layers}-layer", block_size=LENGTH, vocab_size=2048, padded_vocab_size=2048, n_layer=layers,
        n_head=8, n_query_groups=8, n_embd=WIDTH, intermediate_size=4 * WIDTH, bias=False,
        norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, 2048, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    if backend.startswith("thunder_core"):
        import thunder_core  # imported before the clock starts, like torch
    start = time.perf_counter()
    if backend == "torch.compile":
        model = torch.compile(model)
    elif backend == "thunder_core":
        model = thunder_core.jit(model)
    elif backend == CAPTURE_ONCE:
        model = thunder_core.jit(model, capture_blocks_once=True)
    elif backend == "thunder_core(reuse_blocks=False)":
        model = thunder_core.jit(model, reuse_blocks=False)
    logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    return {"first_call_s": time.perf_counter() - start}


def first_add(backend: str) -> dict:
    """Seconds from just after ``import torch`` to the first result of ``a + b`` under ``backend``."""
    import torch

    start = time.perf_counter()
    x = torch.ones(4, 4)
    if backend == "eager":
        add = torch.add
    elif backend == "torch.compile":
        add = torch.compile(lambda a, b: a + b)
    else:
        import thunder_core

        executors = ["torch"] if backend.startswith("thunder_core[torch]") else None
        add = thunder_core.jit(lambda a, b: a + b, executors=executors)
    add(x, x)
    return {"first_call_s": time.perf_counter() - start}


def _run(backend: str, layers: int, env: dict) -> dict:
    from measure import run_isolated

    return run_isolated(__file__, "--backend", backend, "--layers", str(layers), env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend", choices=BACKENDS + ADD_BACKENDS, help="measure one backend in this process (internal)"
    )
    parser.add_argument("--add", action="store_true", help="with --backend: time a + b (internal)")
    parser.add_argument(
        "--add-rounds", type=int, default=5, help="fresh processes per backend for a + b (0: skip)"
    )
    parser.add_argument("--add-only", action="store_true", help="the a + b table only")
    parser.add_argument("--layers", default="2,8,24", help="comma-separated depths")
    parser.add_argument("--rounds", type=int, default=1, help="repetitions of every warm measurement")
    parser.add_argument("--warm-only", action="store_true", help="skip the runs with empty compile caches")
    args = parser.parse_args()
    depths = [int(n) for n in args.layers.split(",")]
    if args.backend:
        print(json.dumps(first_add(args.backend) if args.add else first_call(args.backend, depths[0])))
        return

    from measure import run_isolated

    if args.add_rounds > 0:  # --add-rounds 0: the depth table only
        print(
            f"First call of a + b on 4x4 tensors, seconds after import torch "
            f"(median of {args.add_rounds} fresh processes per backend, backends interleaved)"
        )
        warm_backends = [b for b in ADD_BACKENDS if b.startswith("thunder_core")]
        add_times: dict[str, list[float]] = {
            b: [] for b in [*ADD_BACKENDS, *(b + suffix for b in warm_backends for suffix in SECOND_PROCESS)]
        }
        with tempfile.TemporaryDirectory() as kept, tempfile.TemporaryDirectory() as traces:
            second_env = {
                SECOND_PROCESS[0]: {"THUNDER_CORE_CACHE_DIR": kept},
                SECOND_PROCESS[1]: {"THUNDER_CORE_CACHE_DIR": traces, "THUNDER_CORE_CACHE_TRACES": "1"},
            }
            # a first process fills the cache (each plain run gets an empty one)
            for backend in warm_backends:
                for env in second_env.values():
                    run_isolated(__file__, "--backend", backend, "--add", env=env)
            for _ in range(args.add_rounds):
                for backend in add_times:
                    suffix = next((s for s in SECOND_PROCESS if backend.endswith(s)), "")
                    base = backend.removesuffix(suffix) if suffix else backend
                    result = run_isolated(__file__, "--backend", base, "--add", env=second_env.get(suffix))
                    add_times[backend].append(result["first_call_s"])
        for backend, times in add_times.items():
            times.sort()
            print(
                f"  {backend:40s} {statistics.median(times):7.3f}s   (fastest {times[0]:.3f}s, slowest {times[-1]:.3f}s)"
            )
        print()
    if args.add_only:
        return

    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as shared:
        warm_env = {"TORCHINDUCTOR_CACHE_DIR": f"{shared}/inductor", "NUMBA_CACHE_DIR": f"{shared}/numba"}
        for layers in depths:
            for backend in BACKENDS:
                row = {}
                if not args.warm_only:
                    with tempfile.TemporaryDirectory() as empty:
                        row["cold"] = _run(
                            backend,
                            layers,
                            {
                                "TORCHINDUCTOR_CACHE_DIR": f"{empty}/inductor",
                                "NUMBA_CACHE_DIR": f"{empty}/numba",
                            },
                        )["first_call_s"]
                _run(backend, layers, warm_env)  # fills the shared caches
                row["warm"] = statistics.median(
                    _run(backend, layers, warm_env)["first_call_s"] for _ in range(args.rounds)
                )
                if backend.startswith("thunder_core"):
                    with tempfile.TemporaryDirectory() as traces:
                        disk_env = {
                            **warm_env,
                            "THUNDER_CORE_CACHE_DIR": traces,
                            "THUNDER_CORE_CACHE_TRACES": "1",
                        }
                        _run(backend, layers, disk_env)  # a first process leaves its traces on disk
                        row["disk"] = statistics.median(
                            _run(backend, layers, disk_env)["first_call_s"] for _ in range(args.rounds)
                        )
                results[(backend, layers)] = row
    print(
        f"First call (wrap + forward + backward) of litgpt GPT, width {WIDTH}, batch {BATCH} x {LENGTH} tokens, "
        f"CPU; warm = median of {args.rounds} run(s) with compile caches on disk, cold = empty caches"
    )
    columns = ["warm"] if args.warm_only else ["warm", "cold"]
    header = f"{'backend':40s}" + "".join(f"{f'{n} layers {c}':>17s}" for n in depths for c in columns)
    print(header)
    for backend in BACKENDS:
        cells = "".join(f"{results[(backend, n)][c]:16.2f}s" for n in depths for c in columns)
        print(f"{backend:40s}{cells}")
    for column in columns:
        for n in depths:
            eager = results[("eager", n)][column]
            compiled = results[("torch.compile", n)][column]
            ours = results[("thunder_core", n)][column]
            print(
                f"{n:>2d} layers {column}: thunder_core above eager {ours - eager:6.2f}s, "
                f"torch.compile above eager {compiled - eager:6.2f}s, ratio {compiled / ours:5.2f}x"
            )
    for backend in ("thunder_core", CAPTURE_ONCE):
        for column in columns:
            shallow, deep = depths[0], depths[-1]
            above = {
                n: results[(backend, n)][column] - results[("eager", n)][column] for n in (shallow, deep)
            }
            print(
                f"{backend} above eager, {deep} layers / {shallow} layers ({column}): {above[deep] / above[shallow]:.2f}x"
            )
    print(
        "A later process with thunder_core's disk cache warm too (the traces and executor choices an "
        "earlier identical process stored; torch.compile's warm figure already has its caches warm):"
    )
    for backend in BACKENDS:
        if "disk" in results[(backend, depths[0])]:
            cells = "".join(f"{results[(backend, n)]['disk']:16.2f}s" for n in depths)
            print(f"{backend:40s}{cells}")
    for n in depths:
        eager = results[("eager", n)]["warm"]
        disk = results[("thunder_core", n)]["disk"]
        print(f"{n:>2d} layers: thunder_core with warm disk cache / eager's first step: {disk / eager:5.2f}x")
    print(
        "thunder_core growth from the shallowest to the deepest model, above eager: "
        + ", ".join(
            f"{c} {results[('thunder_core', depths[-1])][c] - results[('eager', depths[-1])][c] - (results[('thunder_core', depths[0])][c] - results[('eager', depths[0])][c]):+.2f}s"
            for c in columns
        )
    )


if __name__ == "__main__":
    main()
