"""What a long compile is doing, shown on an interactive terminal.

A compile still running after ``DELAY`` seconds shows one status line on stderr, drawn by
``tqdm``: the function, the stage it is in (capturing, differentiating, assigning executors,
compiling regions), the blocks captured (and reused), the regions each executor compiled so
far and the time spent (redrawn every second). The line goes away when the compile ends. It is shown only when
stderr is a terminal (``progress = "auto"``, the default); ``"never"`` turns it off and
``"always"`` shows it wherever stderr goes. The setting comes from ``THUNDER_CORE_PROGRESS`` or
the config file's ``progress`` key (``JobConfig.progress``).

The display never affects the compile: a failure to draw (a closed or broken stderr) only
stops the display.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections import Counter
from contextlib import contextmanager

DELAY = 2.0  # seconds a compile runs before its progress is shown
REDRAW = 1.0  # seconds between redraws of a shown line (its elapsed time moves on)
MODES = ("auto", "never", "always")

_current: contextvars.ContextVar[CompileProgress | None] = contextvars.ContextVar(
    "thunder_core_compile_progress", default=None
)


def _wanted(mode: str) -> bool:
    if mode == "never" or sys.stderr is None:
        return False
    if mode == "always":
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


class CompileProgress:
    """The status of one compile; drawn by a daemon thread once it has run for ``DELAY`` seconds."""

    def __init__(self, what: str, tqdm_class):
        self.what = what
        self.stage = "capturing"
        self.counts: Counter[str] = Counter()
        self._tqdm = tqdm_class
        self._bar = None
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._display, name="thunder-core-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set_stage(self, stage: str) -> None:
        with self._lock:
            self.stage = stage
            self._draw()

    def add(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n
            self._draw()

    def describe(self) -> str:
        counted = ", ".join(f"{what}: {n}" for what, n in self.counts.items())
        return f"thunder_core: compiling {self.what}: {self.stage}" + (f" ({counted})" if counted else "")

    def _display(self) -> None:
        if self._ended.wait(DELAY):
            return
        with self._lock:
            if self._ended.is_set():
                return
            try:
                self._bar = self._tqdm(
                    desc=self.describe(),
                    total=None,
                    bar_format="{desc} [{elapsed}]",
                    leave=False,
                    file=sys.stderr,
                )
            except Exception:  # noqa: BLE001 - no display is better than a broken compile
                self._bar = None
                return
        while not self._ended.wait(REDRAW):
            with self._lock:
                self._draw()
                if self._bar is None:
                    return

    def _draw(self) -> None:
        """Redraw the line (the caller holds the lock); a failure ends the display."""
        if self._bar is None:
            return
        try:
            self._bar.set_description_str(self.describe(), refresh=True)
        except Exception:  # noqa: BLE001 - a closed or broken stderr: stop drawing
            self._bar = None

    def close(self) -> None:
        self._ended.set()
        with self._lock:
            bar, self._bar = self._bar, None
            if bar is not None:
                try:
                    bar.close()
                except Exception:  # noqa: BLE001 - as in _draw
                    pass


@contextmanager
def compiling(what: str, mode: str = "auto"):
    """Report the compile of ``what`` while the block runs, under the job's ``progress`` setting
    ``mode`` (a compile inside another reports into the outer one)."""
    if _current.get() is not None or not _wanted(mode):
        yield
        return
    try:
        from tqdm import tqdm  # on the compiling thread: imports never run on two threads at once
    except ImportError:  # a broken environment: compile without the display
        yield
        return
    progress = CompileProgress(what, tqdm)
    token = _current.set(progress)
    try:
        progress.start()
        yield
    finally:
        try:
            progress.close()
        finally:
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
