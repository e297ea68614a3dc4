"""Changing shapes: a 4-layer litgpt served at 32 prompt lengths, and trained over 8 lengths.

Each backend runs in a fresh process with an empty Inductor cache of its own, so every new
shape really compiles; backends are interleaved over ``--rounds`` rounds. Printed per backend:

- serving: the forward at lengths 8, 16, ..., 256 in a random order (the same order for every
  backend), each once: the total time with compiles, the time of the first length alone, the
  compiles made (``cache_info`` entries; Dynamo's unique graphs for ``torch.compile``), the
  seconds then spent waiting for compiles still running in the background
  (``thunder_core.wait_for_compiles()``), and a second pass over the same lengths, all cached;
- training: one training step at each of 8 sequence lengths: total time and compiles;
- generate: Hugging Face ``generate`` (greedy, 32 new tokens, the default ``DynamicCache``, or
  ``StaticCache`` with ``--cache static``) of a
  4-layer random-weight Llama (width 256) with ``model.forward`` compiled: the first generate
  (compiles included), the wait for background compiles after it, the generate after that (the
  first call of a region compiled in the background times it against its torch operations, and
  the first decoding step, a program of its own, compiles its regions at its second call),
  tokens per second in the steady state (the median of 3 more generates of the same prompt), a
  generate of a prompt of a new length, and the compiles made.
  Tokens are compared with eager's;
- steady: the same generate's steady state with every backend in one process (a copy of the model
  each, its forward a code object of its own so that Dynamo's caches are not shared, compiled and
  settled first, background compiles waited for), one generate per backend in
  turn, the order reversed every round, so that the machine's swings fall on every backend
  alike: the median, best and worst tokens per second over ``--rounds`` x 4 turns, and the
  ratios to eager and torch.compile.

Every result is compared with eager's in the same process (logits, and the gradients of the
first step), and a mismatch is printed.

    python benchmarks/dynamic_shapes.py --rounds 3
    python benchmarks/dynamic_shapes.py --parts generate --rounds 2 --backends "eager,torch.compile,thunder_core,thunder_core/dynamic=true,torch.compile(backend=thunder_core),torch.compile(backend=thunder_core)/dynamic=true"
    python benchmarks/dynamic_shapes.py --parts steady --rounds 3 --backends "eager,torch.compile,thunder_core/dynamic=true,torch.compile(backend=thunder_core)/dynamic=true"
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

BACKENDS = "eager,torch.compile,thunder_core,torch.compile(backend=thunder_core)"
SERVING_LENGTHS = list(range(8, 257, 8))
TRAINING_LENGTHS = [32, 48, 64, 80, 96, 112, 128, 144]


def _model(block_size: int):
    from training_step import build_model

    return build_model("litgpt", block_size)


def _compiles(backend: str, wrapped) -> int:
    if backend == "eager":
        return 0
    if backend.startswith("thunder_core"):
        import thunder_core

        return thunder_core.cache_info(wrapped).entries
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def serving(backend: str) -> dict:
    import torch
    from backends import wrap
    from measure import finish_background_compiles

    torch.set_grad_enabled(False)
    model = _model(max(SERVING_LENGTHS)).eval()
    wrapped = wrap(model, backend)
    order = SERVING_LENGTHS[:]
    random.Random(0).shuffle(order)
    prompts = {n: torch.randint(0, 2048, (1, n), generator=torch.Generator().manual_seed(n)) for n in order}
    mismatches = 0
    start = time.perf_counter()
    first = None
    outputs = {}
    for n in order:
        outputs[n] = wrapped(prompts[n])
        if first is None:
            first = time.perf_counter() - start
    total = time.perf_counter() - start
    background = finish_background_compiles()
    start = time.perf_counter()
    for n in order:
        wrapped(prompts[n])
    second = time.perf_counter() - start
    for n in order:
        if not torch.allclose(outputs[n], model(prompts[n]), rtol=1e-4, atol=1e-4):
            mismatches += 1
    return {"total_s": total, "first_s": first, "background_s": background, "second_s": second,
            "compiles": _compiles(backend, wrapped), "mismatches": mismatches}  # fmt: skip


def training(backend: str) -> dict:
    import torch
    from backends import wrap

    model = _model(max(TRAINING_LENGTHS) + 1)
    wrapped = wrap(model, backend)
    reference = _model(max(TRAINING_LENGTHS) + 1)
    mismatches = 0
    start = time.perf_counter()
    for i, n in enumerate(TRAINING_LENGTHS):
        idx = torch.randint(0, 2048, (2, n + 1), generator=torch.Generator().manual_seed(n))
        for net in (wrapped, reference) if i == 0 else (wrapped,):
            logits = net(idx[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1)
            )
            loss.backward()
        if i == 0:
            for a, b in zip(model.parameters(), reference.parameters()):
                mismatches += not torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-5)
        model.zero_grad(set_to_none=True)
    total = time.perf_counter() - start
    return {"total_s": total, "compiles": _compiles(backend, wrapped), "mismatches": mismatches}


GENERATE_PROMPTS = (24, 40)
NEW_TOKENS = 32
STEADY_GENERATES = 3


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def generate(backend: str, cache: str = "dynamic") -> dict:
    import torch
    from backends import wrap_forward
    from measure import finish_background_compiles

    torch.manual_seed(0)
    model = _llama()
    prompts = [
        torch.randint(0, 2048, (1, n), generator=torch.Generator().manual_seed(n)) for n in GENERATE_PROMPTS
    ]

    kwargs = {"cache_implementation": "static"} if cache == "static" else {}

    def run(prompt):
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                  pad_token_id=0, **kwargs)  # fmt: skip

    expected = [run(p) for p in prompts]
    wrap_forward(model, backend)
    outputs = []

    def timed(prompt) -> float:
        start = time.perf_counter()
        outputs.append(run(prompt))
        return time.perf_counter() - start

    first = timed(prompts[0])
    background = finish_background_compiles()
    settle = timed(prompts[0])  # regions compiled in the background, or at their program's second call
    steady = statistics.median(timed(prompts[0]) for _ in range(STEADY_GENERATES))
    new_length = timed(prompts[1])
    wanted = [expected[0]] * (len(outputs) - 1) + [expected[1]]
    mismatches = sum(not torch.equal(got, want) for got, want in zip(outputs, wanted))
    return {"first_s": first, "background_s": background, "settle_s": settle,
            "tokens_per_s": NEW_TOKENS / steady, "new_length_s": new_length,
            "compiles": _compiles(backend, model.forward), "mismatches": mismatches}  # fmt: skip


def _forward_of_its_own(model) -> None:
    """``model.forward`` bound to a copy of the class's function with a code object of its own.
    Dynamo keeps its compiled entries, and its recompile limit, per code object: copies of one
    model compiled by several torch.compile backends in one process would otherwise share them
    (each lookup walking the others' entries, and the later backends running eagerly once the
    limit is reached)."""
    import types

    function = type(model).forward
    copied = types.FunctionType(
        function.__code__.replace(), function.__globals__, function.__name__, function.__defaults__,
        function.__closure__,
    )  # fmt: skip
    copied.__kwdefaults__ = function.__kwdefaults__
    copied.__dict__.update(function.__dict__)
    model.forward = types.MethodType(copied, model)


def steady(backends: list[str], rounds: int, cache: str) -> None:
    """Tokens per second of every backend in one process, generates taken in turn (see the top)."""
    import copy

    import torch
    from backends import wrap_forward
    from measure import finish_background_compiles

    torch.manual_seed(0)
    base = _llama()
    prompt = torch.randint(0, 2048, (1, GENERATE_PROMPTS[0]), generator=torch.Generator().manual_seed(1))
    kwargs = {"cache_implementation": "static"} if cache == "static" else {}

    def run(model):
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                  pad_token_id=0, **kwargs)  # fmt: skip

    expected = run(base)
    models, wrong = {}, {}
    for backend in backends:
        model = copy.deepcopy(base)
        _forward_of_its_own(model)
        wrap_forward(model, backend)
        run(model)
        finish_background_compiles()
        wrong[backend] = sum(not torch.equal(run(model), expected) for _ in range(2))
        models[backend] = model
    rates: dict[str, list[float]] = {b: [] for b in backends}
    for turn in range(rounds * 4):
        for backend in backends if turn % 2 == 0 else backends[::-1]:
            start = time.perf_counter()
            wrong[backend] += not torch.equal(run(models[backend]), expected)
            rates[backend].append(NEW_TOKENS / (time.perf_counter() - start))
    medians = {b: statistics.median(r) for b, r in rates.items()}
    print(f"steady state: HF Llama, 4 layers, width 256, {cache} cache, a prompt of {GENERATE_PROMPTS[0]} tokens, "
          f"{NEW_TOKENS} new tokens, all backends in one process, {rounds * 4} generates each in turn")  # fmt: skip
    print(f"  {'backend':55s} {'tokens/s median (best-worst)':>30s} {'x eager':>9s} {'x torch.compile':>16s}")
    for backend in backends:
        line = f"  {backend:55s} {medians[backend]:>9.1f} ({max(rates[backend]):.1f}-{min(rates[backend]):.1f})".ljust(
            88
        )
        for reference in ("eager", "torch.compile"):
            line += (
                f" {medians[backend] / medians[reference]:>8.2f}x" if reference in medians else f" {'-':>9s}"
            )
        print(line + (f"  {wrong[backend]} RESULTS DIFFER FROM EAGER" if wrong[backend] else ""))


def measure(backend: str, part: str, cache: str) -> dict:
    if part == "generate":
        return {"backend": backend, **generate(backend, cache)}
    parts = {"serving": serving, "training": training}
    return {"backend": backend, **parts[part](backend)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default=BACKENDS)
    parser.add_argument("--parts", default="serving,training")
    parser.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                        help="generate: Hugging Face's DynamicCache (the default) or StaticCache")  # fmt: skip
    parser.add_argument("--backend", help="measure one backend in this process (internal)")
    parser.add_argument("--part", help="(internal)")
    args = parser.parse_args()
    if args.backend:
        import json

        print(json.dumps(measure(args.backend, args.part, args.cache)))
        return
    from measure import interleaved, run_isolated, spread

    for part in args.parts.split(","):
        if part == "steady":
            steady(args.backends.split(","), args.rounds, args.cache)
            continue

        def one(backend: str, part: str = part) -> dict:
            with tempfile.TemporaryDirectory() as cache:  # empty compile caches: every shape compiles
                env = {"TORCHINDUCTOR_CACHE_DIR": cache}
                return run_isolated(
                    __file__, "--backend", backend, "--part", part, "--cache", args.cache, env=env
                )

        runs = interleaved(one, args.backends.split(","), args.rounds)
        if part == "generate":
            print(f"generate: HF Llama, 4 layers, width 256, {args.cache} cache, prompts of {GENERATE_PROMPTS[0]} "
                  f"then {GENERATE_PROMPTS[1]} tokens, {NEW_TOKENS} new tokens, {args.rounds} interleaved rounds")  # fmt: skip
            columns = ["first_s", "background_s", "settle_s", "tokens_per_s", "new_length_s"]
        else:
            lengths = SERVING_LENGTHS if part == "serving" else TRAINING_LENGTHS
            print(
                f"{part}: 4-layer litgpt, width 256, {len(lengths)} lengths, {args.rounds} interleaved rounds"
            )
            columns = ["total_s", "first_s", "background_s", "second_s"] if part == "serving" else ["total_s"]
        print(f"  {'backend':38s}" + "".join(f"{c:>22s}" for c in columns) + f"{'compiles':>10s}")
        for backend, results in runs.items():
            ok = [r for r in results if columns[0] in r]
            if not ok:
                print(f"  {backend:38s} failed: {results[0].get('error', 'no result')}")
                continue
            wrong = sum(r["mismatches"] for r in ok)
            print(
                f"  {backend:38s}"
                + "".join(f" {spread([r[c] for r in ok], digits=2):>21s}" for c in columns)
                + f"{spread([r['compiles'] for r in ok], digits=0):>10s}"
                + (f"  {wrong} RESULTS DIFFER FROM EAGER" if wrong else "")
            )


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
