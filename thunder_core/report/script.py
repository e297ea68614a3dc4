"""``thunder-core report SCRIPT.py``: run a script and report every program it jitted.

While the script runs, ``thunder_core.jit`` is wrapped to remember each function and module it
returns, and each jitted call remembers its most recent arguments. When the script ends (or
fails), one page reports every program that ran, each measured on the arguments of its last
call as ``thunder_core.report`` measures.
"""

from __future__ import annotations

import runpy
import sys
from contextlib import contextmanager
from pathlib import Path

import thunder_core
from thunder_core.jit.function import ThunderFunction
from thunder_core.report import report_many


@contextmanager
def _recording():
    created: list = []
    last_call: dict[int, tuple] = {}
    real_jit, real_call = thunder_core.jit, ThunderFunction.__call__

    def jit(fn, **options):
        jitted = real_jit(fn, **options)
        created.append(jitted)
        return jitted

    def call(self, *args, **kwargs):
        last_call[id(self)] = (args, kwargs)
        return real_call(self, *args, **kwargs)

    jit.__doc__, jit.__wrapped__ = real_jit.__doc__, real_jit
    thunder_core.jit, ThunderFunction.__call__ = jit, call
    try:
        yield created, last_call
    finally:
        thunder_core.jit, ThunderFunction.__call__ = real_jit, real_call


def report_script(script: str, script_args: list[str], output: str, rounds: int) -> int:
    """Run ``script`` with ``script_args`` as ``sys.argv[1:]``, then write the report to ``output``.
    Returns the script's exit status (1 if it raised)."""
    status = 0
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *script_args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python SCRIPT.py` does
    with _recording() as (created, last_call):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as done:
            status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException as error:  # noqa: BLE001 - reported, then the report of what ran is written
            print(f"thunder-core report: {script} raised {type(error).__name__}: {error}", file=sys.stderr)
            status = 1
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
    calls = []
    for jitted in created:
        function = jitted._forward if hasattr(jitted, "_forward") else jitted
        if function.last_compiled() is None:
            continue  # never called
        args, kwargs = last_call.get(id(function), ((), {}))
        calls.append((jitted, args, kwargs))
    if not calls:
        print(
            f"thunder-core report: {script} called no function or module made by thunder_core.jit",
            file=sys.stderr,
        )
        return status or 1
    path = report_many(calls, path=output, rounds=rounds)
    print(f"thunder-core report: {len(calls)} jitted program(s) -> {Path(path).resolve()}")
    return status
