"""Measurement helpers shared by the benchmarks: timing, and peak memory of one step on CPU.

CPU has no allocator statistics like ``torch.cuda.max_memory_allocated`` and Inductor's
buffers bypass dispatch modes, so memory is measured the same way for every backend: the
growth of the process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``)
over its resident set before the step. Run under ``MALLOC_MMAP_THRESHOLD_=65536`` (as
``run_isolated`` does) so that freed tensors go back to the OS.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def finish_background_compiles() -> float:
    """Wait for thunder_core's background compiles (a recompiled program runs its regions with
    torch until they finish), so that a steady state is timed after them; the seconds waited."""
    start = time.perf_counter()
    if "thunder_core" in sys.modules:
        sys.modules["thunder_core"].wait_for_compiles()
    return time.perf_counter() - start


def median_seconds(fn, *, warmup: int = 2, repeats: int = 10) -> float:
    for _ in range(warmup):
        fn()
    finish_background_compiles()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_bytes(fn) -> int:
    """Peak resident memory added while ``fn()`` runs."""
    gc.collect()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM to the current RSS
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def live_tensor_peak(fn) -> tuple[int, list[tuple[int, str]]]:
    """Peak bytes of live CPU tensors allocated while ``fn()`` runs, and the tensors alive at
    that moment as (bytes, where each was allocated).

    Unlike the resident set this does not depend on the C library's heap layout or on what the
    interpreter allocates beside tensors, so the same program gives the same figure in every
    run. It reads the profiler's memory timeline (``profile_memory=True``; the same data as
    ``torch.profiler.profile.export_memory_timeline``), which sees Inductor's buffers too.
    """
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        fn()
    start_ns = prof.profiler.kineto_results.trace_start_ns()
    events = [e for e in prof.events() if e.name != "[memory]"]
    live, at_peak, current, peak, peak_time = {}, {}, 0, 0, None
    for t, action, (key, _version), size in prof._memory_profile().timeline:
        if key.device.type != "cpu" or action == Action.PREEXISTING:
            continue
        if action == Action.CREATE:
            if key in live:  # the storage was freed without an event (an allocation reused)
                current -= live[key][0]
            current += size
            live[key] = (size, t)
        elif action == Action.DESTROY and key in live:
            current -= size
            del live[key]
        if current > peak:
            peak, peak_time, at_peak = current, t, dict(live)

    def where(t_ns: int) -> str:
        t_us = (t_ns - start_ns) / 1000
        inside = sorted(
            (e for e in events if e.time_range.start <= t_us <= e.time_range.end),
            key=lambda e: e.time_range.start,
        )
        names = [e.name for e in inside]
        compiled = [n for n in names if n.startswith(("<thunder_core", "## Call CompiledFxGraph"))]
        return " > ".join(filter(None, [compiled[-1] if compiled else "", names[-1] if names else "?"]))

    return peak, [(size, where(t)) for size, t in at_peak.values()] if peak_time is not None else []


def run_isolated(script: str, *args: str, for_memory: bool = False, env: dict | None = None) -> dict:
    """Run ``script`` in a fresh interpreter; it prints one JSON object as its last line.

    ``for_memory`` sets ``MALLOC_MMAP_THRESHOLD_`` so freed tensors return to the OS and the
    resident set follows live tensors; it slows allocation down, so timings are taken in a
    separate run without it. ``env`` adds environment variables. Unless ``env`` names a
    ``THUNDER_CORE_CACHE_DIR``, each run gets an empty one of its own, so that no run reuses the
    traces an earlier run left on disk.
    """
    given = env or {}
    env = {**os.environ, **given}
    if for_memory:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    with tempfile.TemporaryDirectory() as empty:
        if "THUNDER_CORE_CACHE_DIR" not in given:
            env["THUNDER_CORE_CACHE_DIR"] = empty
        done = subprocess.run(
            [sys.executable, script, *args], env=env, capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def interleaved(run_one, backends: list[str], rounds: int) -> dict[str, list[dict]]:
    """``run_one(backend)`` for every backend, round after round (A B C A B C ...).

    This machine's speed can change several-fold within minutes; interleaving makes such a
    change hit every backend alike, so the per-round ratios stay meaningful. A backend that
    fails is recorded as ``{"error": ...}`` and the others go on.
    """
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    for _ in range(rounds):
        for backend in backends:
            try:
                runs[backend].append(run_one(backend))
            except Exception as error:  # noqa: BLE001 - reported beside the others' results
                runs[backend].append({"error": f"{type(error).__name__}: {str(error)[-300:]}"})
    return runs


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """``median (min-max)`` of ``values`` times ``scale``."""
    if not values:
        return "-"
    low, mid, high = min(values) * scale, statistics.median(values) * scale, max(values) * scale
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def round_ratios(reference: list[dict], other: list[dict], key: str) -> list[float]:
    """reference[key] / other[key] per round where both ran: above 1 means ``other`` was faster."""
    return [r[key] / o[key] for r, o in zip(reference, other) if key in r and key in o]
