"""Which user code a capture ran, and which global names that code reads.

While a function is captured, a profile hook notes every Python function entered whose code
is the user's (not torch's, not the standard library's, not thunder_core's). The first time
a code object is entered, ``on_first_entry(code, globals)`` is called *before* its body runs,
so the values it is about to read are seen as they were before the call changed anything.

``global_chains(code)`` lists what a code object reads from its globals: each ``LOAD_GLOBAL``
name with the attribute names loaded right after it (``settings.SCALE`` ->
``("settings", "SCALE")``), found once per code object from its bytecode.
"""

from __future__ import annotations

import dis
import os
import sys
import sysconfig
from collections.abc import Callable
from functools import cache, lru_cache
from types import CodeType

import torch

_THUNDER_CORE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_NEVER_USER = (os.path.dirname(torch.__file__) + os.sep, _THUNDER_CORE_DIR)
_STDLIB = tuple({sysconfig.get_paths()["stdlib"] + os.sep, os.path.dirname(os.__file__) + os.sep})
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_GLOBAL_LOADS = {"LOAD_GLOBAL", "LOAD_NAME"}
_ATTR_LOADS = {"LOAD_ATTR", "LOAD_METHOD"}


@cache
def is_user_code(filename: str) -> bool:
    """True for code outside torch, thunder_core and the standard library (installed libraries count)."""
    if filename.startswith(_NEVER_USER) or filename.startswith("<frozen"):
        return False
    if any(marker in filename for marker in _INSTALLED):
        return True
    return not filename.startswith(_STDLIB)


@lru_cache(maxsize=4096)
def global_chains(code: CodeType) -> tuple[tuple[str, ...], ...]:
    """The global names ``code`` loads, each with the attributes loaded directly after it."""
    chains: dict[tuple[str, ...], None] = {}
    chain: list[str] | None = None
    for instruction in dis.get_instructions(code):
        if instruction.opname in _GLOBAL_LOADS:
            if chain:
                chains[tuple(chain)] = None
            chain = [instruction.argval]
        elif chain is not None and instruction.opname in _ATTR_LOADS:
            chain.append(instruction.argval)
        else:
            if chain:
                chains[tuple(chain)] = None
            chain = None
    if chain:
        chains[tuple(chain)] = None
    return tuple(chains)


class ExecutedUserCode:
    """Context manager: calls ``on_first_entry(code, f_globals)`` for each user code object entered.

    Uses ``sys.setprofile`` (an already installed profiler keeps receiving its events).
    """

    def __init__(self, on_first_entry: Callable[[CodeType, dict], None]):
        self._on_first_entry = on_first_entry
        self._seen: set[CodeType] = set()
        self._previous = None

    def _profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code not in self._seen:
                self._seen.add(code)
                if is_user_code(code.co_filename):
                    self._on_first_entry(code, frame.f_globals)
        if self._previous is not None:
            self._previous(frame, event, arg)

    def __enter__(self) -> ExecutedUserCode:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)
