"""The HTML report, checked in a real headless browser (Chromium): what it renders for a 4-layer
and a 24-layer litgpt training step and for the torch.compile front end. Without a browser
(``apt-get install chromium``; ``THUNDER_CORE_TEST_BROWSER`` names another) those checks skip;
what can be checked from the file itself always runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch
from models import litgpt_gpt, token_batch

import thunder_core


def _browser() -> str | None:
    named = os.environ.get("THUNDER_CORE_TEST_BROWSER")
    if named:
        return shutil.which(named) or named
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


BROWSER = _browser()
needs_browser = pytest.mark.skipif(
    BROWSER is None,
    reason="no headless browser: install Chromium (apt-get install chromium) to check the report",
)


def _rendered_dom(path) -> str:
    """The page's DOM after its scripts ran, as Chromium renders it."""
    done = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom",
         path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class _Elements(HTMLParser):
    """Every element's tag and attributes, and the text of the ones whose class is asked for."""

    def __init__(self, text_of: tuple[str, ...] = ("time",)):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.texts: dict[str, list[str]] = {c: [] for c in text_of}
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.elements.append((tag, attributes))
        classes = (attributes.get("class") or "").split()
        self._open.append(next((c for c in self.texts if c in classes), None))
        if self._open[-1]:
            self.texts[self._open[-1]].append("")

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        if self._open and self._open[-1]:
            self.texts[self._open[-1]][-1] += data

    def with_class(self, name: str) -> list[dict]:
        return [a for _, a in self.elements if name in (a.get("class") or "").split()]


def _parse(text: str) -> _Elements:
    parser = _Elements()
    parser.feed(text)
    return parser


def _embedded(text: str) -> dict:
    found = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', text, re.S)
    return json.loads(found.group(1))


def _training_report(tmp_path, layers: int, name: str):
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=layers, n_embd=64)
    jitted = thunder_core.jit(model)
    idx = token_batch(2, 16)
    before = [p.detach().clone() for p in model.parameters()]
    path = thunder_core.report(jitted, idx, path=tmp_path / name, rounds=2)
    for p, q in zip(model.parameters(), before):  # the report trains nothing and leaves no gradients
        assert p.grad is None and torch.equal(p.detach(), q)
    return path, jitted


def test_the_report_of_a_training_step_holds_its_traces_times_and_cache(tmp_path):
    path, jitted = _training_report(tmp_path, 4, "report.html")
    text = path.read_text()
    data = _embedded(text)
    (section,) = data["sections"]
    measured = section["measured"]
    assert measured["trains"] and measured["eager_ms"]["median"] > 0 and measured["compiled_ms"]["median"] > 0
    executed = [t for t in thunder_core.last_traces(jitted) if t.decisions]
    assert executed and all(f"thunder_core/{t.function_name}" in measured["regions"] for t in executed)
    (block,) = thunder_core.last_blocks(jitted)
    assert f"{block.name}: " in text and "× 4 calls" in text  # the layer shown once, with its count
    assert text.count(f"Repeated block {block.name}") == 1
    program = section["programs"][0]
    assert [e["reason"] for e in program["entries"]] == list(thunder_core.cache_info(jitted).reasons)
    assert program["entries"][0]["guards"] > 0
    assert program["saved"] and all(s["bytes"] > 0 for s in program["saved"])
    assert "http://" not in text and "https://" not in text  # self-contained: nothing from the network


@needs_browser
def test_the_report_renders_in_a_browser_with_regions_colours_and_times(tmp_path):
    path, jitted = _training_report(tmp_path, 4, "report.html")
    data = _embedded(path.read_text())
    dom = _parse(_rendered_dom(path))
    (body,) = [a for tag, a in dom.elements if tag == "body"]
    assert body.get("data-rendered") == "true"  # the page's script ran to its end
    rows = dom.with_class("region-time")
    assert rows and {r["data-executor"] for r in rows} >= {"torch"}
    if "inductor" in data["sections"][0]["executors"]:
        assert any(r["data-executor"] == "inductor" for r in rows)
        assert dom.with_class("region")  # fused regions, folded with their operations
        assert dom.with_class("generated")  # and with the code Inductor generated for them
    for element in [*rows, *dom.with_class("executor-time")]:  # coloured by executor, as the legend says
        assert f"--ex-color: {data['colors'][element['data-executor']]}" in element["style"]
    times = [t for t in dom.texts["time"] if t]
    assert len(times) > 10 and all(t.endswith("ms") or "ms /" in t for t in times)


@needs_browser
def test_the_report_of_a_24_layer_model_stays_usable(tmp_path):
    path, _ = _training_report(tmp_path, 24, "report24.html")
    text = path.read_text()
    assert "× 24 calls" in text
    assert path.stat().st_size < 8 * 2**20
    dom = _parse(_rendered_dom(path))
    assert dom.with_class("region-time") and [t for t in dom.texts["time"] if t]


def test_the_report_of_a_jitted_method_leaves_no_gradients_behind(tmp_path):
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64)
    jitted = thunder_core.jit(model.forward)
    x = torch.randn(3, requires_grad=True)
    path = thunder_core.report(jitted, token_batch(2, 16), path=tmp_path / "method.html", rounds=1)
    assert _embedded(path.read_text())["sections"][0]["measured"]["trains"]
    assert all(p.grad is None for p in model.parameters())
    double = thunder_core.jit(lambda t: (t * 2).sin())
    thunder_core.report(double, x, path=tmp_path / "fn.html", rounds=1)
    assert x.grad is None


def _with_break(x, w):
    y = torch.tanh(x @ w)
    print("between graphs")
    return (y * y).sum()


def test_the_report_of_torch_compile_shows_graphs_breaks_and_splits(tmp_path, capsys):
    torch._dynamo.reset()
    compiled = torch.compile(_with_break, backend="thunder_core")
    x, w = torch.randn(6, 4), torch.randn(4, 4, requires_grad=True)
    for _ in range(2):  # the same break twice: reported once, with its count of graphs
        compiled(x, w)
    path = thunder_core.report(compiled, x, w, path=tmp_path / "dynamo.html", rounds=1)
    data = _embedded(path.read_text())
    (section,) = data["sections"]
    dynamo = section["dynamo"]
    assert len(dynamo["graphs"]) >= 2
    (graph_break,) = dynamo["breaks"]
    assert "_with_break" in graph_break["location"] or "test_report.py" in graph_break["location"]
    assert section["programs"] and all(p["label"].startswith("graph ") for p in section["programs"])
    torch._dynamo.reset()


SCRIPT = """
import sys, torch, thunder_core
from models import litgpt_gpt, token_batch

model = thunder_core.jit(litgpt_gpt(n_layer=2))
double = thunder_core.jit(lambda a, b: torch.tanh(a @ b) * 2)
unused = thunder_core.jit(lambda a: a + 1)  # never called: not in the report
idx = token_batch(2, 16)
model(idx).mean().backward()
double(torch.randn(4, 4), torch.randn(4, 4))
print("arguments:", sys.argv[1:])
"""


def test_the_cli_reports_every_program_a_script_jitted(tmp_path):
    import sys

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    output = tmp_path / "out.html"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "thunder_core", "report", "-o", str(output), "--rounds", "1", str(script), "--flag"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "arguments: ['--flag']" in done.stdout and "2 jitted program(s)" in done.stdout
    data = _embedded(output.read_text())
    assert [s["title"] for s in data["sections"]] == ["GPT", "<lambda>"]
    assert all(s["measured"]["compiled_ms"]["median"] > 0 for s in data["sections"])
    assert data["sections"][0]["measured"]["trains"] and not data["sections"][1]["measured"]["trains"]
