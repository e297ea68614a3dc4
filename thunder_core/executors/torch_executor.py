"""The torch executor: runs any symbol with eager PyTorch (its ``impl``).

It is an entry point of thunder-core (``thunder_core.executors: torch``) like any other
executor, always available, lowest priority: it takes what no other executor claims.
"""

from __future__ import annotations

from thunder_core.executors.base import Executor, Implementation
from thunder_core.executors.fusion import TORCH, to_torch
from thunder_core.ir.symbols import BoundSymbol, Symbol
from thunder_core.plugins.hookspecs import Availability, hookimpl

NAME = TORCH


class TorchExecutor(Executor):
    default_priority = -1000

    def implementation_for(self, symbol: Symbol) -> Implementation | None:
        return Implementation(symbol.impl) if symbol.impl is not None else None


executor = TorchExecutor(NAME)


def claim(bsym: BoundSymbol) -> BoundSymbol:
    """Mark ``bsym`` as run by torch; generated code calls the torch callable directly."""
    return to_torch(bsym)


@hookimpl
def thunder_core_probe() -> Availability:
    return Availability.ok()


@hookimpl
def thunder_core_register_executor(register) -> None:
    register(executor)
