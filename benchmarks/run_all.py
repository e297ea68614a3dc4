"""Every benchmark behind README's *Measured* section, run one after the other, printed as Markdown.

    python benchmarks/run_all.py                          # everything (about an hour on 2 cores)
    python benchmarks/run_all.py --only decode-30m,training-litgpt
    python benchmarks/run_all.py --write-readme           # also replace those sections in README.md

Each section is one command of this folder, run in a fresh process with nothing else on the
machine; what it prints is copied as it is, under the command and the hardware it ran on.
With ``--write-readme`` each section that ran replaces its own block in README.md (between
``<!-- run_all:NAME -->`` and ``<!-- /run_all:NAME -->``); the other blocks stay as they were,
with the date and hardware of their own run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SECTIONS = {
    "overhead": ("cached-call overhead", ["overhead.py"]),
    "import-time": ("import time and first call", ["import_time.py"]),
    "decode-30m": ("batch-1 decoding, litgpt ~30M parameters", ["generate.py", "--config", "30m"]),
    "decode-4k": ("batch-1 decoding, litgpt 6 layers width 512, 4096-token vocabulary", ["generate.py", "--config", "4k"]),
    "training-litgpt": ("training step, litgpt 4 layers", ["training_step.py", "--rounds", "5"]),
    "training-llama": ("training step, transformers Llama 4 layers", ["training_step.py", "--model", "llama", "--rounds", "5"]),
    "compile-time": ("first call against depth", ["compile_time.py"]),
    "quantization": ("decoding with quantized weights", ["quantization.py"]),
    "distributed": ("2-process training on gloo", ["distributed.py"]),
    "elementwise": ("elementwise chain", ["elementwise.py"]),
}  # fmt: skip


def hardware() -> str:
    """The CPU model, its core count and memory, and the torch build: what every figure depends on."""
    import torch

    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as info:
            kib = int(next(line.split()[1] for line in info if line.startswith("MemTotal")))
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{model}, {os.cpu_count()} cores{memory}, {gpu}; torch {torch.__version__}, Python {platform.python_version()}"


def run_section(name: str) -> str:
    """One section's Markdown: title, command, hardware and date, and what the command printed."""
    title, argv = SECTIONS[name]
    command = "python benchmarks/" + " ".join(argv)
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, argv[0]), *argv[1:]], capture_output=True, text=True, cwd=ROOT
    )
    printed = (
        done.stdout.strip() if done.returncode == 0 else f"failed ({done.returncode}):\n{done.stderr[-2000:]}"
    )
    when = datetime.date.today().isoformat()
    return (
        f"<!-- run_all:{name} -->\n#### {title}\n\n`{command}` — {when}, {hardware()}\n\n"
        f"```text\n{printed}\n```\n<!-- /run_all:{name} -->"
    )


def write_readme(blocks: dict[str, str], path: str = os.path.join(ROOT, "README.md")) -> None:
    """Replace each section's block in README.md; a section without a block is added at the end of *Measured*."""
    with open(path) as readme:
        text = readme.read()
    for name, block in blocks.items():
        pattern = re.compile(
            rf"<!-- run_all:{re.escape(name)} -->.*?<!-- /run_all:{re.escape(name)} -->", re.S
        )
        if pattern.search(text):
            text = pattern.sub(lambda _, block=block: block, text)
        else:
            anchor = "<!-- /run_all -->"
            if anchor not in text:
                raise SystemExit(f"{path} has no {anchor} marker to add section {name!r} before")
            text = text.replace(anchor, f"{block}\n\n{anchor}")
    with open(path, "w") as readme:
        readme.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated sections among {', '.join(SECTIONS)}")
    parser.add_argument("--write-readme", action="store_true", help="replace those sections in README.md")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] if args.only else list(SECTIONS)
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}; the sections are {list(SECTIONS)}")
    blocks = {}
    for name in names:
        blocks[name] = run_section(name)
        print(blocks[name] + "\n", flush=True)
    if args.write_readme:
        write_readme(blocks)


if __name__ == "__main__":
    main()
