"""What a long compile is doing, shown on an interactive terminal.

A compile still running after ``DELAY`` seconds shows one status line on stderr, drawn by
``tqdm``: the function, the stage it is in (capturing, differentiating, assigning executors,
compiling regions), the blocks captured and the regions each executor compiled so far. The
line goes away when the compile ends. It is shown only when stderr is a terminal
(``progress = "auto"``, the default); ``"never"`` turns it off and ``"always"`` shows it
wherever stderr goes. The setting comes from ``THUNDER_CORE_PROGRESS`` or the config file's
``progress`` key (``JobConfig.progress``). Compiles that end sooner than ``DELAY`` never start the display.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections import Counter
from contextlib import contextmanager

DELAY = 2.0  # seconds a compile runs before its progress is shown
MODES = ("auto", "never", "always")

_current: contextvars.ContextVar[CompileProgress | None] = contextvars.ContextVar(
    "thunder_core_compile_progress", default=None
)


def _wanted(mode: str) -> bool:
    if mode == "never":
        return False
    if mode == "always":
        return True
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


class CompileProgress:
    """The status of one compile; drawn once it has run for ``DELAY`` seconds."""

    def __init__(self, what: str):
        self.what = what
        self.stage = "capturing"
        self.counts: Counter[str] = Counter()
        self._bar = None
        self._lock = threading.Lock()
        self._done = False
        self._timer = threading.Timer(DELAY, self._show)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def set_stage(self, stage: str) -> None:
        self.stage = stage
        self._refresh()

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] += n
        self._refresh()

    def describe(self) -> str:
        counted = ", ".join(f"{what}: {n}" for what, n in self.counts.items())
        return f"thunder_core: compiling {self.what}: {self.stage}" + (f" ({counted})" if counted else "")

    def _show(self) -> None:
        from tqdm import tqdm

        with self._lock:
            if self._done:
                return
            self._bar = tqdm(
                desc=self.describe(),
                total=None,
                bar_format="{desc} [{elapsed}]",
                leave=False,
                file=sys.stderr,
            )

    def _refresh(self) -> None:
        if self._bar is None:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.set_description_str(self.describe(), refresh=True)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            if self._bar is not None:
                self._bar.close()
                self._bar = None


@contextmanager
def compiling(what: str, mode: str = "auto"):
    """Report the compile of ``what`` while the block runs, under the job's ``progress`` setting
    ``mode`` (a compile inside another reports into the outer one)."""
    if _current.get() is not None or not _wanted(mode):
        yield
        return
    progress = CompileProgress(what)
    token = _current.set(progress)
    progress.start()
    try:
        yield
    finally:
        progress.close()
        _current.reset(token)


def stage(name: str) -> None:
    """The compile running in this context entered stage ``name``."""
    progress = _current.get()
    if progress is not None:
        progress.set_stage(name)


def count(what: str, n: int = 1) -> None:
    """The compile running in this context made ``n`` more of ``what`` (``"inductor regions"``)."""
    progress = _current.get()
    if progress is not None:
        progress.add(what, n)
