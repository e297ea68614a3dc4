"""Finding the user's line that made an operation: the first frame outside torch and us."""

from __future__ import annotations

import linecache
import os
import sys

import torch

from thunder_core.ir.symbols import SourceLocation

_TORCH = os.path.dirname(torch.__file__) + os.sep
_OURS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # thunder_core/ (this is ir/)
    os.path.dirname(os.__file__) + os.sep + "contextlib.py",
)
_SKIPPED = (_TORCH, *_OURS)


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
    return _first_frame_outside(_SKIPPED)


# torch's own plumbing between a library's call and capture's mode
_DISPATCH = tuple(_TORCH + name for name in ("overrides.py", "_tensor.py", "utils" + os.sep + "_device.py"))


def calling_location() -> SourceLocation | None:
    """The innermost frame outside thunder_core and torch's dispatch: where the call was made,
    also inside a library (``torch/nn/modules/batchnorm.py``), where ``user_location`` names the
    user's line that led there."""
    return _first_frame_outside((*_OURS, *_DISPATCH))


def _first_frame_outside(skipped: tuple) -> SourceLocation | None:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame = frame.f_back
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    line = linecache.getline(filename, frame.f_lineno).strip()
    return SourceLocation(short_filename(filename), frame.f_lineno, frame.f_code.co_name, line)
