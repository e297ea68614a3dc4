"""A replacement of a PyTorch attribute that holds while any thread captures.

Capture replaces a few of PyTorch's functions for the code it runs (``torch_fast_paths``,
``torch_vmap``). The replacement is installed when the first capture begins and taken out after
the last one ends, counted across threads; it acts only on a thread that is capturing
(``active()``), and other threads get PyTorch's behaviour meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager


class PatchedWhileCapturing:
    """``install()`` when the first capture begins, ``restore()`` after the last ends."""

    def __init__(self, install: Callable[[], None], restore: Callable[[], None]):
        self._install, self._restore = install, restore
        self._lock = threading.Lock()
        self._captures = 0
        self._thread = threading.local()  # .active: this thread is capturing

    def active(self) -> bool:
        """Whether this thread is capturing."""
        return getattr(self._thread, "active", False)

    @contextmanager
    def capturing(self):
        """One capture on this thread (captures nest, and run on several threads at once)."""
        with self._lock:
            if self._captures == 0:
                self._install()
            self._captures += 1
        outer = self.active()
        self._thread.active = True
        try:
            yield
        finally:
            self._thread.active = outer
            with self._lock:
                self._captures -= 1
                if self._captures == 0:
                    self._restore()
