"""Finding the user's line that made an operation: the first frame outside torch and us."""

from __future__ import annotations

import linecache
import os
import sys

import torch

from thunder_core.ir.symbols import SourceLocation

_SKIPPED = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # thunder_core/ (this is ir/)
    os.path.dirname(os.__file__) + os.sep + "contextlib.py",
)


def short_filename(filename: str) -> str:
    """Relative to the working directory, or to site-packages, where possible."""
    cwd = os.getcwd() + os.sep
    if filename.startswith(cwd):
        return filename[len(cwd) :]
    marker = os.sep + "site-packages" + os.sep
    if marker in filename:
        return filename.split(marker, 1)[1]
    return filename


def user_location() -> SourceLocation | None:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        frame = frame.f_back
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    line = linecache.getline(filename, frame.f_lineno).strip()
    return SourceLocation(short_filename(filename), frame.f_lineno, frame.f_code.co_name, line)
