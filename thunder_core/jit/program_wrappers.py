"""Wrappers put in a jitted method's own place: ``model.forward = timed(thunder_core.jit(model.forward))``.

Such a wrapper is how the program is called, not something the program reads, so the guards do
not walk its own state (a call counter, a timer); only its identity is checked.
"""

from __future__ import annotations

import functools


def wraps_program(item, program, max_depth: int) -> bool:
    """Whether ``item`` calls ``program`` as a wrapper does: a closure holding it, a
    ``functools.partial`` of it, or either of them reached through ``__wrapped__`` (decorators
    of decorators made with ``functools.wraps``)."""
    seen = 0
    while item is not None and seen < max_depth:
        if item is program:
            return True
        if isinstance(item, functools.partial) and (
            any(a is program for a in item.args) or any(v is program for v in item.keywords.values())
        ):
            return True
        for cell in getattr(item, "__closure__", None) or ():
            try:
                if cell.cell_contents is program:
                    return True
            except ValueError:  # an empty cell
                continue
        item, seen = getattr(item, "__wrapped__", None), seen + 1
    return False
