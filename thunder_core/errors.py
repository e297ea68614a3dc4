"""Errors thunder_core raises for input it cannot compile, each naming the way out."""

from __future__ import annotations


class ThunderCoreError(Exception):
    """Base class of thunder_core's own errors."""


class DataDependentError(ThunderCoreError):
    """Python control flow or a Python number depends on the values inside a tensor."""


class CaptureError(ThunderCoreError):
    """An operation could not be captured into a trace."""
