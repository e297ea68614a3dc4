"""Check the built docs site: every public name of thunder_core.extend is in the API reference.

    python scripts/check_api_reference.py site/

Each name of ``thunder_core.extend.__all__`` must have its own entry on the reference page, and
each public function or class there must have a docstring (rendered on that page).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import thunder_core.extend as extend


def main(site: str) -> int:
    page = (Path(site) / "api" / "extend" / "index.html").read_text()
    problems = []
    for name in extend.__all__:
        if f'id="thunder_core.extend.{name}"' not in page:
            problems.append(f"{name}: not in the API reference")
        obj = getattr(extend, name)
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and not inspect.getdoc(obj):
            problems.append(f"{name}: no docstring")
    for problem in problems:
        print(problem)
    print(f"{len(extend.__all__)} public names of thunder_core.extend checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "site"))
