"""The torch executor: runs any symbol with eager PyTorch (its ``impl``)."""

from __future__ import annotations

from thunder_core.ir.symbols import BoundSymbol


def can_execute(bsym: BoundSymbol) -> bool:
    return bsym.symbol.impl is not None


def claim(bsym: BoundSymbol) -> BoundSymbol:
    """Mark ``bsym`` as run by torch; generated code calls the torch callable directly."""
    return bsym.replace(executor="torch", impl=None)
