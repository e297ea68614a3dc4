"""The report's HTML, from ``thunder_core.report.collect``'s data, with a Jinja2 template.

The page is one file: its style and script are inlined, the data it draws its tables and
colours from is embedded as JSON, and nothing is loaded from the network.
"""

from __future__ import annotations

import json
from importlib import resources

import jinja2


def embed_json(data) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element."""
    return json.dumps(data, default=str).replace("</", "<\\/")


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render(data: dict) -> str:
    folder = resources.files("thunder_core.report")
    templates = {
        name: (folder / f"{name}.html.jinja").read_text(encoding="utf-8") for name in ("report", "stage")
    }
    environment = jinja2.Environment(
        loader=jinja2.DictLoader(templates), autoescape=True, undefined=jinja2.StrictUndefined
    )
    environment.filters["bytes"] = _bytes
    template = environment.get_template("report")
    return template.render(
        data=data,
        data_json=embed_json(data),
        style=(folder / "report.css").read_text(encoding="utf-8"),
        script=(folder / "report.js").read_text(encoding="utf-8"),
    )
