"""The python executor: bookkeeping statements of generated code (deleting dead values).

An entry point of thunder-core (``thunder_core.executors: python``), always available.
"""

from __future__ import annotations

from thunder_core.executors.base import Executor, Implementation
from thunder_core.ir.symbols import PYTHON, Symbol, delete_symbol
from thunder_core.plugins.hookspecs import Availability, hookimpl

NAME = "python"


__all__ = ["NAME", "delete_symbol", "executor"]


class PythonExecutor(Executor):
    default_priority = 1000

    def implementation_for(self, symbol: Symbol) -> Implementation | None:
        return Implementation(symbol.impl) if symbol.has_tag(PYTHON) else None


executor = PythonExecutor(NAME)


@hookimpl
def thunder_core_probe() -> Availability:
    return Availability.ok()


@hookimpl
def thunder_core_register_executor(register) -> None:
    register(executor)
