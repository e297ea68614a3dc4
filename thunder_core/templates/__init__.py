"""The template a new executor package starts from (``thunder-core new-executor NAME``)."""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATE = Path(__file__).parent / "executor"


def write_executor_package(name: str, directory: str = ".") -> Path:
    """Write ``thunder-executor-<name>/`` under ``directory`` and return its path."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"executor name {name!r}: use lowercase letters, digits and underscores")
    from thunder_core._version import __version__

    major, minor = __version__.split(".")[:2]
    values = {
        "name": name,
        "package": f"thunder_executor_{name}",
        "distribution": f"thunder-executor-{name}",
        "core_range": f">={major}.{minor},<{major}.{int(minor) + 1}",
    }
    root = Path(directory) / values["distribution"]
    if root.exists():
        raise FileExistsError(f"{root} already exists")
    for source in TEMPLATE.rglob("*.tmpl"):
        relative = source.relative_to(TEMPLATE).with_suffix("")
        parts = [values["package"] if p == "package" else p for p in relative.parts]
        target = root.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = source.read_text()
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", value)
        target.write_text(text)
    return root
