"""The core never imports upward: nothing in thunder_core names an executor or plugin package."""

from __future__ import annotations

import ast
from pathlib import Path

import thunder_core

CORE = Path(thunder_core.__file__).parent
UPWARD = ("thunder_executor_", "thunder_plugin_")


def test_core_modules_import_no_executor_or_plugin_package():
    offenders = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(CORE)}: {n}" for n in names if n.startswith(UPWARD)]
    assert not offenders
