"""Where one decode step or one training step spends its time under thunder_core's default executors.

    python benchmarks/where_time_goes.py decode      # litgpt ~30M, batch 1, one token per step
    python benchmarks/where_time_goes.py training    # litgpt 4 layers, 4 x 256 tokens
    python benchmarks/where_time_goes.py training --model llama   # transformers' Llama instead
    python benchmarks/where_time_goes.py training --model llama --in-step   # regions timed in the step

Prints, for the step: its median time; every measured region with its candidates' times (what
``thunder_core.explain`` shows), heaviest first, counted once per call of a repeated block; and
the ATen operations the profiler sees outside compiled regions, by self time per step.
``--in-step`` also times each measured region's calls inside the running step (a timer around
the kept candidate) beside what measuring it alone found.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _regions(jfn) -> list[tuple[float, str, str]]:
    """(seconds of the kept candidate x calls per step, where, the measurement) per measured region."""
    import thunder_core

    seen, rows = set(), []
    for report in thunder_core.explain(jfn).operations:
        if "measured" not in report.note or (report.trace, report.note) in seen:
            continue
        seen.add((report.trace, report.note))
        calls = 1
        if " calls) " in report.trace:
            calls = int(report.trace.split(" calls) ")[0].rsplit(", ", 1)[1])
        measured = report.note[report.note.index("measured") :]
        kept = measured.rsplit(": ", 1)[1].removesuffix(" kept")
        timings = dict(
            part.rsplit(" ", 2)[:2] for part in measured.removeprefix("measured ").split(": ")[0].split(", ")
        )
        first_op = report.operation.split("(")[0]
        rows.append(
            (float(timings[kept]) * 1e-6 * calls, f"{report.trace} x{calls}, from {first_op}", measured)
        )
    return sorted(rows, reverse=True)


def _aten_per_step(step, steps: int = 5) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    totals = collections.Counter()
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            totals[event.key] += event.self_cpu_time_total / 1e6 / steps
    return totals.most_common(8)


class _InStep:
    """Times every call of each measured claim's kept candidate (``Measured`` binds it after the
    first call; the timer wraps what it binds)."""

    def __init__(self):
        from thunder_core.executors import selection

        self.seconds, self.calls, self.claims = collections.Counter(), collections.Counter(), {}
        bind = selection.Measured._bind
        timer = self

        def timed_bind(measured, fn):
            key = id(measured)
            timer.claims[key] = measured

            def timed(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    timer.seconds[key] += time.perf_counter() - start
                    timer.calls[key] += 1

            return bind(measured, timed)

        selection.Measured._bind = timed_bind

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def report(self, steps: int) -> None:
        print("measured regions timed inside the step (per call: in the step / measured alone):")
        for key in sorted(self.seconds, key=lambda k: -self.seconds[k])[:12]:
            claim = self.claims[key]
            chosen = claim.selection.chosen if claim.selection else "?"
            alone = claim.selection.seconds.get(chosen, 0.0) if claim.selection else 0.0
            per_call = self.seconds[key] / self.calls[key]
            print(
                f"  {self.seconds[key] / steps * 1e3:6.2f} ms/step  {self.calls[key] / steps:3.0f} calls  "
                f"{per_call * 1e6:7.1f} / {alone * 1e6:7.1f} us  {chosen:10s} {claim._operations[:70]}"
            )


def main() -> None:
    import torch

    import thunder_core

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("decode", "training"))
    parser.add_argument(
        "--model", choices=("litgpt", "llama"), default="litgpt", help="the training step's model"
    )
    parser.add_argument("--in-step", action="store_true", help="time the measured regions inside the step")
    args = parser.parse_args()
    in_step = _InStep() if args.in_step else None
    if args.what == "decode":
        from generate import build_model, generate

        torch.set_grad_enabled(False)
        model = thunder_core.jit(build_model("30m"))
        prompt = torch.randint(0, 8192, (1, 32), generator=torch.Generator().manual_seed(0))
        generate(model, prompt, 4)
        token, position = prompt[:, -1:], torch.tensor([40])

        def step():
            return model(token, position)
    else:
        from training_step import BATCH, LENGTH, build_model, step_of

        model = thunder_core.jit(build_model(args.model))
        idx = torch.randint(0, 2048, (BATCH, LENGTH + 1), generator=torch.Generator().manual_seed(0))
        step = step_of(model, idx, args.model)

    step()
    step()
    if in_step is not None:
        in_step.reset()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(f"{args.what} step: median {statistics.median(times) * 1e3:.2f} ms over 10 steps")
    if in_step is not None:
        in_step.report(10)
    rows = _regions(model)
    print(f"measured regions ({sum(r[0] for r in rows) * 1e3:.2f} ms per step in the kept candidates):")
    kinds = collections.defaultdict(list)
    for seconds, where, measured in rows:
        kinds[where].append((seconds, measured))
    for where, found in sorted(kinds.items(), key=lambda item: -sum(s for s, _ in item[1])):
        total = sum(s for s, _ in found)
        won = collections.Counter(m.rsplit(": ", 1)[1] for _, m in found)
        heaviest = max(found)[1]
        print(
            f"  {total * 1e3:7.3f} ms in {len(found):3d} region(s) {where}; {dict(won)}; heaviest: {heaviest}"
        )
    print("ATen operations by self time per step (outside compiled regions):")
    for name, seconds in _aten_per_step(step):
        print(f"  {seconds * 1e3:7.3f} ms  {name}")


if __name__ == "__main__":
    main()
