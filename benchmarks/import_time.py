"""Cold start: how long ``import thunder_core`` takes after ``import torch`` (and that it imports no
plugin module), and how long the first call of a jitted ``a + b`` with the torch executor takes
(and whether it loaded ``torch._dynamo`` or ``torch._inductor``, which such a job never uses).

Each measurement runs in a fresh interpreter; prints the fastest and the median of the runs.

    python benchmarks/import_time.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

IMPORT = (
    "import sys, time, json; import torch; start = time.perf_counter(); import thunder_core; "
    "took = time.perf_counter() - start; "
    "print(json.dumps({'took': took, 'loaded': [m for m in sys.modules "
    "if m.startswith(('thunder_executor_', 'thunder_plugin_'))]}))"
)
FIRST_CALL = (
    "import sys, time, json; import torch; import thunder_core; "
    "add = thunder_core.jit(lambda a, b: a + b, executors=['torch']); x = torch.ones(4, 4); "
    "start = time.perf_counter(); add(x, x); took = time.perf_counter() - start; "
    "print(json.dumps({'took': took, 'loaded': [m for m in ('torch._dynamo', 'torch._inductor') "
    "if m in sys.modules]}))"
)


def _runs(code: str, runs: int) -> tuple[list[float], list[str]]:
    results = [
        json.loads(
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        )
        for _ in range(runs)
    ]
    return [r["took"] * 1e3 for r in results], sorted({m for r in results for m in r["loaded"]})


def main(runs: int = 7) -> None:
    times, imported = _runs(IMPORT, runs)
    print(f"import thunder_core after import torch ({runs} fresh interpreters)")
    print(f"  fastest {min(times):.0f} ms, median {statistics.median(times):.0f} ms")
    print(f"  plugin modules imported: {imported or 'none'}")
    times, loaded = _runs(FIRST_CALL, runs)
    print(
        f"first call of jit(lambda a, b: a + b, executors=['torch']) on 4x4 tensors ({runs} fresh interpreters)"
    )
    print(f"  fastest {min(times):.0f} ms, median {statistics.median(times):.0f} ms")
    print(f"  PyTorch compiler modules loaded: {', '.join(loaded) or 'none'}")


if __name__ == "__main__":
    main()
