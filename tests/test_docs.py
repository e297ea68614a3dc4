"""The writing-an-executor tutorial works as written: its code blocks build, install and run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import thunder_core

TUTORIAL = Path(thunder_core.__file__).parent.parent / "docs" / "writing-an-executor.md"
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks():
    return [(lang, body) for lang, body in FENCE.findall(TUTORIAL.read_text())]


def _files(blocks) -> dict[str, str]:
    """Blocks whose first line is a comment naming a file: ``# pyproject.toml``."""
    files = {}
    for _, body in blocks:
        first = body.splitlines()[0]
        match = re.fullmatch(r"# ([\w./-]+\.(?:py|toml))", first)
        if match:
            files[match.group(1)] = body
    return files


def test_the_tutorial_package_installs_claims_add_and_uses_only_the_surface(tmp_path):
    blocks = _blocks()
    files = _files(blocks)
    assert {
        "pyproject.toml",
        "thunder_executor_mykernels/__init__.py",
        "thunder_executor_mykernels/_impl.py",
    } <= set(files)
    for name, body in files.items():
        if name.startswith("tests/"):
            continue
        path = tmp_path / "thunder-executor-mykernels" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        if name.endswith(".py"):
            imports = re.findall(r"^\s*(?:from|import) (thunder_core[\w.]*)", body, re.M)
            assert set(imports) <= {"thunder_core", "thunder_core.extend", "thunder_core.plugins"}, imports
    package = tmp_path / "thunder-executor-mykernels"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-build-isolation", str(package)], check=True)
    try:
        usage = [body for lang, body in blocks if lang == "python" and "thunder_core.jit(" in body][-1]
        done = subprocess.run(
            [sys.executable, "-c", usage],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "THUNDER_CORE_NO_AUTOLOAD": "1"},
        )
        assert done.returncode == 0, done.stderr
        assert "mykernels" in done.stdout
    finally:
        subprocess.run([*pip, "uninstall", "-q", "-y", "thunder-executor-mykernels"], check=False)
