"""Write the pictures of docs/inspecting.md from a real report: a 4-layer litgpt training step.

    python scripts/report_pictures.py            # needs Chromium (apt-get install chromium)

Writes docs/images/report-overview.png and docs/images/report-traces.png (screenshots of the
page's overview and of its executed traces) and leaves the page itself in the temporary
directory it prints.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from models import litgpt_gpt, token_batch  # noqa: E402

import thunder_core  # noqa: E402


def main() -> int:
    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if browser is None:
        print("no Chromium found: apt-get install chromium", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    model = thunder_core.jit(litgpt_gpt(n_layer=4, n_embd=64))
    idx = token_batch(2, 32)
    page = Path(tempfile.mkdtemp()) / "report.html"
    thunder_core.report(model, idx, path=page, rounds=5)
    images = ROOT / "docs" / "images"
    images.mkdir(exist_ok=True)
    # The traces picture: a copy of the page that hides what comes before the traces (headless
    # Chromium does not scroll to an anchor before its screenshot).
    traces = page.with_name("traces.html")
    hide = "<style>.overview, .program > *:not(#traces-0):not(#traces-0 ~ *) { display: none; }</style>"
    traces.write_text(page.read_text().replace("</head>", hide + "</head>", 1))
    for name, shown, height in (("report-overview", page, 1100), ("report-traces", traces, 1000)):
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size=1280,{height}", f"--screenshot={images / (name + '.png')}", shown.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        print(images / (name + ".png"))
    print(f"the page: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
