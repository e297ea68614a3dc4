"""Capture: running a Python function on proxies and recording what it does as a trace."""

from thunder_core.capture.capture import capture

__all__ = ["capture"]
