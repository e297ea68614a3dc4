"""The trace IR: proxies, symbols, bound symbols, traces and their Python code."""

from thunder_core.ir.proxies import NumberProxy, TensorProxy
from thunder_core.ir.symbols import BoundSymbol, Symbol
from thunder_core.ir.trace import Trace

__all__ = ["BoundSymbol", "NumberProxy", "Symbol", "TensorProxy", "Trace"]
