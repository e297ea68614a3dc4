"""How long ``import thunder_core`` takes after ``import torch``, and that it imports no plugin module.

Each measurement runs in a fresh interpreter; prints the fastest and the median of the runs.

    python benchmarks/import_time.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

CODE = (
    "import sys, time, json; import torch; start = time.perf_counter(); import thunder_core; "
    "took = time.perf_counter() - start; "
    "print(json.dumps({'took': took, 'plugins': [m for m in sys.modules "
    "if m.startswith(('thunder_executor_', 'thunder_plugin_'))]}))"
)


def main(runs: int = 7) -> None:
    results = [
        json.loads(
            subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout
        )
        for _ in range(runs)
    ]
    times = [r["took"] * 1e3 for r in results]
    imported = sorted({m for r in results for m in r["plugins"]})
    print(f"import thunder_core after import torch ({runs} fresh interpreters)")
    print(f"  fastest {min(times):.0f} ms, median {statistics.median(times):.0f} ms")
    print(f"  plugin modules imported: {imported or 'none'}")


if __name__ == "__main__":
    main()
