"""The python executor: bookkeeping statements of generated code (deleting dead values)."""

from __future__ import annotations

from thunder_core.ir.symbols import PYTHON, Symbol


def _delete(*values) -> None:
    """Reference meaning of ``del``: nothing to compute."""


delete_symbol = Symbol(name="del", impl=_delete, printed_name="del", tags=frozenset({PYTHON}))
