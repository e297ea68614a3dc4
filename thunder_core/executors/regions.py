"""Regions: runs of neighbouring bound symbols a fusion executor compiles as one callable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thunder_core.ir.symbols import BoundSymbol
from thunder_core.ir.trace import Trace


@dataclass
class Region:
    """A run of neighbouring bound symbols claimed by one fusion executor."""

    bound_symbols: list[BoundSymbol]
    inputs: list[Any] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)

    def as_trace(self, name: str) -> Trace:
        return Trace(
            inputs=self.inputs,
            bound_symbols=self.bound_symbols,
            output=tuple(self.outputs),
            function_name=name,
        )


class RegionNotSupported(Exception):
    """Raised by ``compile_region``: this region goes back to the torch executor (message = why)."""


def flatten_to_prims(bsyms):
    """Yield the prims that ``bsyms`` decompose into; RegionNotSupported for an op without one."""
    for b in bsyms:
        if b.symbol.is_prim:
            yield b
        elif b.subsymbols:
            yield from flatten_to_prims(b.subsymbols)
        else:
            raise RegionNotSupported(f"{b.symbol.printed_name} has no decomposition into prims")
