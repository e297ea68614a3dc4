"""The OpInfo forward sweep with a chosen executor list, printing the three honest counts.

    python scripts/opinfo_sweep.py                      # the default executors (what is installed)
    python scripts/opinfo_sweep.py --executors torch    # the torch executor alone

Every deterministic OpInfo (float32, CPU, first 3 samples) runs jitted and eagerly; it counts as
"symbols only" when every op was captured as a thunder_core symbol, "with opaque calls" when at
least one op ran as an opaque torch call, else "failed". With fusion executors installed each
claimed region compiles, so a full sweep takes tens of minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import collections
import time

import thunder_core
from thunder_core.testing.known_failures import KNOWN_FORWARD_FAILURES
from thunder_core.testing.opinfo import (
    assert_same,
    draws_random_numbers,
    is_deterministic,
    op_db,
    opaque_ops,
    opinfo_id,
    run_case,
    sample_cases,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executors", help="comma-separated executor list (default: every installed one)")
    parser.add_argument(
        "--min-region-size",
        type=int,
        help="for fusion executors (inductor, numba): compile regions this small, so one-op samples are fused too",
    )
    args = parser.parse_args()
    options: dict = {"executors": args.executors.split(",")} if args.executors else {}
    if args.min_region_size is not None:
        from thunder_core.plugins.manager import plugin_manager

        fusers = [n for n in ("inductor", "numba") if n in plugin_manager().names("executor")]
        options["options"] = {n: {"min_region_size": args.min_region_size} for n in fusers}
    counts: collections.Counter = collections.Counter()
    claimed_by: collections.Counter = collections.Counter()
    failures = {}
    start = time.perf_counter()
    for opinfo in op_db():
        name = opinfo_id(opinfo)
        try:
            cases = sample_cases(opinfo)
        except Exception:
            continue
        if not cases or draws_random_numbers(opinfo) or not all(is_deterministic(c) for c in cases):
            continue
        opaque, executors = False, set()
        try:
            for case in cases:
                actual, expected, jfn = run_case(case, options)
                assert_same(actual, expected)
                opaque |= bool(opaque_ops(thunder_core.last_traces(jfn)[0]))
                executors |= {r.executor for r in thunder_core.explain(jfn).operations}
        except Exception as error:  # noqa: BLE001 - counted and listed below
            counts["failed"] += 1
            failures[name] = (
                f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
            )
            continue
        counts["with opaque calls" if opaque else "symbols only"] += 1
        claimed_by.update(executors)
    total = sum(counts.values())
    passed = counts["symbols only"] + counts["with opaque calls"]
    print(f"executors: {options.get('executors', 'default (installed)')} {options.get('options', '')}; {total} deterministic OpInfos, "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    for key in ("symbols only", "with opaque calls", "failed"):
        print(f"  {key:18s} {counts[key]:4d}  ({counts[key] / total:.1%})")
    print(f"  pass rate {passed / total:.1%}; OpInfos each executor ran part of: {dict(claimed_by)}")
    for name, why in sorted(failures.items()):
        known = " (known in the core)" if name in KNOWN_FORWARD_FAILURES else ""
        print(f"  failed: {name}{known}: {why}")


if __name__ == "__main__":
    main()
