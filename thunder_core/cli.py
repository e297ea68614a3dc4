"""The ``thunder-core`` command (also ``python -m thunder_core``).

thunder-core plugins [--json]     every discovered executor and plugin, with its status
thunder-core doctor               what to install on this machine
thunder-core new-executor NAME    write a new executor package from the template
thunder-core report SCRIPT.py     run a script, then write the HTML report of what it jitted
"""

from __future__ import annotations

import argparse
import json
import sys

from thunder_core.plugins.manager import AVAILABLE, DISABLED, plugin_manager

# First-party executor packages: what each needs, to say what to install.
KNOWN_EXECUTORS = {
    "thunder-executor-inductor": ("cpu", "torch.compile (Inductor) as a fusion executor"),
    "thunder-executor-numba": ("cpu", "fused elementwise and row kernels written with Numba"),
    "thunder-executor-nvfuser": ("cuda", "nvFuser fusion of elementwise, reductions and matmuls"),
    "thunder-executor-cudnn": ("cuda", "cuDNN scaled_dot_product_attention"),
    "thunder-executor-te": ("cuda", "TransformerEngine linear layers (FP8 on compute capability 8.9+)"),
    "thunder-executor-apex": ("cuda", "NVIDIA Apex fused cross-entropy and norms"),
    "thunder-executor-cupy": ("cuda", "custom CUDA kernels written with CuPy"),
}


def _rows():
    """Every plugin, loaded as far as it goes (import, probe, register), so each problem shows.

    Plugins disabled by the environment or the config file are shown as disabled, by what.
    """
    from dataclasses import replace

    from thunder_core.plugins.config import resolve

    disabled = resolve().disabled
    manager = plugin_manager()
    rows = []
    for name in manager.names():
        if name in disabled:
            info = manager.plugins[name]
            rows.append(replace(info, status=DISABLED, reason=disabled[name], remedy=""))
        else:
            rows.append(manager.load(manager.plugins[name]))
    return rows


def cmd_plugins(args) -> int:
    rows = _rows()
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    header = ("name", "kind", "distribution", "version", "status", "import", "reason")
    table = [header]
    for r in rows:
        imported = f"{r.import_seconds * 1e3:.1f} ms" if r.import_seconds is not None else "-"
        reason = r.reason + (f" (fix: {r.remedy})" if r.remedy else "")
        table.append(
            (r.name, r.kind, r.distribution or "-", r.version or "-", r.status, imported, reason or "-")
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  " + str(row[-1]))
    return 0


def _machine() -> tuple[bool, str]:
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return True, f"{torch.cuda.get_device_name()} (compute capability {major}.{minor})"
    return False, "no CUDA device"


def cmd_doctor(args) -> int:
    import torch

    from thunder_core._version import __version__

    cuda, device = _machine()
    print(f"thunder-core {__version__}, torch {torch.__version__}, Python {sys.version.split()[0]}; {device}")
    rows = _rows()
    installed = {r.distribution for r in rows}
    problems = [r for r in rows if r.status != AVAILABLE]
    for r in problems:
        print(f"- {r.name}: {r.status}: {r.reason}" + (f"\n    fix: {r.remedy}" if r.remedy else ""))
    suggestions = [
        (dist, what)
        for dist, (needs, what) in KNOWN_EXECUTORS.items()
        if dist not in installed and (needs == "cpu" or cuda)
    ]
    if suggestions:
        print("Executors that would work on this machine and are not installed:")
        for dist, what in suggestions:
            print(f"  pip install {dist}    # {what}")
    if not problems and not suggestions:
        print("Everything that can run here is installed and available.")
    return 0


def cmd_new_executor(args) -> int:
    from thunder_core.templates import write_executor_package

    path = write_executor_package(args.name, args.directory)
    print(f"wrote {path}; next: pip install -e {path} && thunder-core plugins")
    return 0


def cmd_report(args) -> int:
    from thunder_core.report.script import report_script

    return report_script(args.script, args.script_args, args.output, args.rounds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="thunder-core", description="thunder-core executors and plugins")
    sub = parser.add_subparsers(dest="command", required=True)
    plugins = sub.add_parser("plugins", help="list every discovered executor and plugin with its status")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(run=cmd_plugins)
    doctor = sub.add_parser("doctor", help="say what to install on this machine")
    doctor.set_defaults(run=cmd_doctor)
    new = sub.add_parser("new-executor", help="write a new executor package from the template")
    new.add_argument("name", help="short name, e.g. 'mykernels' -> thunder-executor-mykernels")
    new.add_argument("--directory", default=".", help="where to create the package folder")
    new.set_defaults(run=cmd_new_executor)
    report = sub.add_parser(
        "report", help="run a script, then write the HTML report of every program it jitted"
    )
    report.add_argument("script", help="the Python script to run")
    report.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    report.add_argument("-o", "--output", default="report.html", help="where to write the page")
    report.add_argument("--rounds", type=int, default=3, help="timed rounds against eager per program")
    report.set_defaults(run=cmd_report)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
