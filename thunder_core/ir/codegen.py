"""Turning a trace into Python source plus the globals it needs (``PythonCode``).

Proxies print as their names, constants as Python literals where one exists, and any
other object (a real tensor captured from a closure, a generator, an executor's compiled
kernel) as a guarded global name that cannot shadow an input or an intermediate.
"""

from __future__ import annotations

import itertools
import linecache
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from thunder_core.ir import symbolic
from thunder_core.ir.proxies import PROXY_TYPES
from thunder_core.ir.symbols import BoundSymbol

_counter = itertools.count()
_IDENTIFIER = re.compile(r"[^0-9a-zA-Z_]")


@dataclass
class PythonCode:
    """Source of one function and the globals it runs with."""

    source: str
    globals: dict[str, Any]
    function_name: str

    def callable(self):
        """Compile the source; tracebacks show the generated lines."""
        filename = f"<thunder_core {self.function_name} {next(_counter)}>"
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        code = compile(self.source, filename, "exec")
        namespace = dict(self.globals)
        exec(code, namespace)
        for name, value in list(namespace.items()):
            if hasattr(type(value), "attach_to_namespace"):  # a callable that rebinds itself once
                value.attach_to_namespace(namespace, name)
        return namespace[self.function_name]


@dataclass
class _Namespace:
    """The globals of one generated function, with unique names for non-literal objects."""

    globals: dict[str, Any] = field(default_factory=dict)
    by_id: dict[int, str] = field(default_factory=dict)

    def module(self, name: str, module) -> str:
        self.globals[name] = module
        return name

    def add(self, obj, hint: str) -> str:
        name = self.by_id.get(id(obj))
        if name is not None:
            return name
        base = "_" + _IDENTIFIER.sub("_", hint).strip("_")
        name = base
        for n in itertools.count(1):
            if name not in self.globals:
                break
            name = f"{base}_{n}"
        self.globals[name] = obj
        self.by_id[id(obj)] = name
        return name


# Modules generated code may name (``prims.add(...)``): registered by the modules themselves,
# so this layer imports nothing above it. name -> (module, the import line the source shows).
_NAMED_MODULES: dict[str, tuple[Any, str]] = {}


def register_named_module(name: str, module, import_line: str) -> None:
    """Let generated code call ``<name>.<symbol>``; ``thunder_core.ops.prims`` registers ``prims``."""
    _NAMED_MODULES[name] = (module, import_line)


class Printer:
    """Prints values and bound symbols of one trace into one namespace."""

    def __init__(self):
        self.namespace = _Namespace()
        self.namespace.module("torch", torch)
        self.bound_sizes: set | None = None  # the size symbols the trace's inputs give, once known

    def value(self, x) -> str:
        if isinstance(x, PROXY_TYPES):
            return x.name
        if isinstance(x, symbolic.SYMBOLIC_TYPES):
            self.namespace.module("math", math)  # torch's printer writes math.floor, math.ceil, ...
            if self.bound_sizes is not None and not x.node.expr.free_symbols <= self.bound_sizes:
                # A part of a program (a fusion region) using a size none of its inputs has.
                raise symbolic.SymbolicSizeError(f"the size {x} is not a size of this program's inputs")
            return symbolic.source(x)
        if x is None or type(x) in (bool, int, str):  # not an IntEnum member: its repr is no literal
            return repr(x)
        if type(x) is float:
            if math.isfinite(x):
                return repr(x)
            return f"float({str(x)!r})"
        if type(x) is complex:
            return f"complex({self.value(x.real)}, {self.value(x.imag)})"
        if isinstance(x, torch.dtype):
            return str(x)
        if isinstance(x, torch.device):
            return f"torch.device({str(x)!r})"
        if isinstance(x, torch.Size):
            return f"torch.Size({self.value(list(x))})"
        if isinstance(x, (torch.memory_format, torch.layout)):
            return str(x)
        if x is Ellipsis:
            return "..."
        if isinstance(x, slice):
            return f"slice({self.value(x.start)}, {self.value(x.stop)}, {self.value(x.step)})"
        if type(x) is tuple:
            inner = ", ".join(self.value(item) for item in x)
            return f"({inner},)" if len(x) == 1 else f"({inner})"
        if type(x) is list:
            return "[" + ", ".join(self.value(item) for item in x) + "]"
        if type(x) is dict and all(isinstance(k, (str, int)) for k in x):
            return "{" + ", ".join(f"{k!r}: {self.value(v)}" for k, v in x.items()) + "}"
        if isinstance(x, torch.Tensor):
            return self.namespace.add(x, "constant_tensor")
        return self.namespace.add(x, type(x).__name__)

    def target(self, output) -> str | None:
        """The left-hand side that binds a bound symbol's output, or None."""
        if output is None:
            return None
        if isinstance(output, PROXY_TYPES):
            return output.name
        if isinstance(output, (tuple, list)):
            parts = [self.target(item) or "_" for item in output]
            if len(parts) == 1:
                return f"({parts[0]},)"
            return "(" + ", ".join(parts) + ")" if parts else None
        return "_"

    def callee(self, bsym: BoundSymbol) -> str:
        if bsym.impl is not None:
            return self.namespace.add(bsym.impl, bsym.impl_name or getattr(bsym.impl, "__name__", "impl"))
        name = bsym.symbol.printed_name
        if name.startswith("torch."):
            return name
        prefix = name.split(".", 1)[0]
        if prefix in _NAMED_MODULES:
            self.namespace.module(prefix, _NAMED_MODULES[prefix][0])
            return name
        return self.namespace.add(bsym.symbol, name)

    def call(self, bsym: BoundSymbol) -> str:
        args = [self.value(a) for a in bsym.args]
        args += [f"{k}={self.value(v)}" for k, v in bsym.kwargs.items()]
        return f"{self.callee(bsym)}({', '.join(args)})"

    def bound_symbol(self, bsym: BoundSymbol, indent: str, depth: int, comment: bool = False) -> list[str]:
        from thunder_core.ir.symbols import AUTOGRAD_FALLBACK, NO_GRAD, OPAQUE

        if bsym.symbol.name == "del":
            names = ", ".join(p.name for p in bsym.flat_args())
            return [f"{indent}{'# ' if comment else ''}del {names}"]
        target = self.target(bsym.output)
        statement = f"{target} = {self.call(bsym)}" if target else self.call(bsym)
        types = "; ".join(f'{p.name}: "{p.type_string()}"' for p in bsym.flat_outputs())
        notes = []
        if types:
            notes.append(types)
        if bsym.symbol.has_tag(OPAQUE):
            notes.append("opaque: no thunder_core symbol, run by the torch executor")
        if bsym.symbol.has_tag(AUTOGRAD_FALLBACK):
            notes.append("autodiff: no VJP rule, differentiated by PyTorch autograd")
        if bsym.symbol.has_tag(NO_GRAD):
            notes.append("grad mode off, as eager ran it")
        if bsym.executor and bsym.executor != "torch" and bsym.executor != "python":
            notes.append(f"executor: {bsym.executor}")
        line = f"{indent}{'# ' if comment else ''}{statement}"
        if notes:
            line += "  # " + " | ".join(notes)
        lines = [line]
        if depth > 0:
            for sub in bsym.subsymbols:
                lines += self.bound_symbol(sub, indent + "  ", depth - 1, comment=True)
        return lines


def _unused_name(base: str, taken: set[str]) -> str:
    return next(f"{base}{i or ''}" for i in itertools.count() if f"{base}{i or ''}" not in taken)


def region_name(trace, bsym: BoundSymbol) -> str:
    """The profiler range of one line of an executed trace:
    ``thunder_core/<trace>/<operation> <first output> [<executor that runs it>]``. The executor
    is the one that runs the line now: a measured claim's winner, torch after a failed first
    run, ``program`` for a call of a repeated block's program (whose lines have ranges of their own).
    """
    name = bsym.impl_name or bsym.symbol.name
    first = next(iter(bsym.flat_outputs()), None)
    output = f" {first.name}" if first is not None else ""
    return f"thunder_core/{trace.function_name}/{name}{output} [{running_executor(bsym)}]"


def running_executor(bsym: BoundSymbol) -> str | None:
    """Who runs a line of an executed trace now: a measured claim's winner, ``torch`` after its
    executor failed, ``program`` for a call of a repeated block's program, else its claimer."""
    from thunder_core.ir.symbols import PROGRAM

    if bsym.symbol.has_tag(PROGRAM):
        return "program"
    selection = getattr(bsym.impl, "selection", None)  # a measured claim, once measured
    chosen = getattr(selection, "chosen", None)
    if isinstance(chosen, str):
        return chosen
    if getattr(bsym.impl, "failure", None):  # its executor failed: torch runs it
        return "torch"
    return bsym.executor


def _profiled_calls(trace) -> bool:
    return any(b.executor not in (None, "python") for b in trace.bound_symbols)


class _ProfiledVersion:
    """The trace compiled with a profiler range around every executor call, built on first use
    and again when a line's executor changed since (a measured claim decided, a region that fell
    back to torch), so that the ranges name who runs each line now."""

    def __init__(self, trace):
        self.trace = trace
        self.run = None
        self._executors: list | None = None

    def __call__(self, *args):
        executors = [running_executor(b) for b in self.trace.bound_symbols]
        if self.run is None or executors != self._executors:
            self.run = trace_to_python(self.trace, subsymbol_depth=0, profiled=True).callable()
            self._executors = executors
        return self.run(*args)


def _profiler_enabled_expression(printer: Printer) -> str:
    """Source that is true while ``torch.profiler`` (or the autograd profiler) records."""
    import torch.autograd.profiler as profiler

    if isinstance(getattr(profiler, "_is_profiler_enabled", None), bool):  # a module flag: cheapest
        return f"{printer.namespace.module('_autograd_profiler', profiler)}._is_profiler_enabled"
    return f"{printer.namespace.add(torch._C._autograd._profiler_enabled, 'profiler_enabled')}()"


def trace_to_python(
    trace, *, subsymbol_depth: int = 1, profiled: bool = False, profiler_switch: bool = False
) -> PythonCode:
    """Print ``trace`` as a function definition.

    ``profiled``: every executor call runs inside a ``torch.profiler.record_function`` range
    named by ``region_name``, and the whole call inside ``thunder_core/<function name>``.
    ``profiler_switch``: the function first checks whether a profiler is recording and, if so,
    runs the profiled version instead (built on first use), so that ranges cost nothing otherwise.
    """
    printer = Printer()
    names = [p.name for p in trace.inputs]
    box = _unused_name("inputs", set(names)) if trace.boxed_inputs else None
    lines = [f"def {trace.function_name}({box or ', '.join(names)}):"]
    for p in trace.inputs:
        lines.append(f'  # {p.name}: "{p.type_string()}"')
    if profiler_switch and _profiled_calls(trace):
        switch = printer.namespace.add(_ProfiledVersion(trace), "profiled_version")
        lines.append(f"  if {_profiler_enabled_expression(printer)}:")
        lines.append(f"    return {switch}({box or ', '.join(names)})")
    body_start = len(lines)
    if box is not None:
        if names:
            lines.append(f"  {', '.join(names)}{',' if len(names) == 1 else ''} = {box}")
        lines.append(f"  {box}.clear()  # the caller's list held the only other reference")
    bindings = symbolic.size_symbols(trace.inputs)  # symbolic sizes, bound from the inputs
    for symbol, size, read in bindings:
        name = symbolic.symbol_source(symbol, size)
        if read != name:  # an int input named as its symbol (a size the forward saved) is bound already
            lines.append(f"  {name} = {read}")
    printer.bound_sizes = {symbol for symbol, _, _ in bindings}
    record = printer.namespace.add(torch.profiler.record_function, "record_function") if profiled else None
    last_source = None
    for bsym in trace.bound_symbols:
        if bsym.source is not None and bsym.source != last_source:
            lines.append("")
            lines.append(f"  # {bsym.source}")
            last_source = bsym.source
        if profiled and bsym.executor not in (None, "python"):
            lines.append(f"  with {record}({region_name(trace, bsym)!r}):")
            lines += printer.bound_symbol(bsym, "    ", subsymbol_depth)
        else:
            lines += printer.bound_symbol(bsym, "  ", subsymbol_depth)
    if trace.output_treespec is not None:
        from torch.utils._pytree import tree_unflatten

        spec = trace.output_treespec
        if _holds_size(spec):
            rebuild = printer.namespace.add(
                lambda flat: _sizes_restored(tree_unflatten(flat, spec), spec), "rebuild_output"
            )
        else:
            rebuild = printer.namespace.add(lambda flat: tree_unflatten(flat, spec), "rebuild_output")
        lines.append(f"  return {rebuild}({printer.value(list(trace.output))})")
    else:
        lines.append(f"  return {printer.value(trace.output)}")
    if profiled:
        lines[body_start:] = [
            f"  with {record}({('thunder_core/' + trace.function_name)!r}):",
            *("  " + line if line else line for line in lines[body_start:]),
        ]
    header = []
    if trace.provenance is not None:
        header.append(f"# {trace.provenance}")
    imports = ["import torch"]
    imports += [line for name, (_, line) in _NAMED_MODULES.items() if name in printer.namespace.globals]
    others = sorted(n for n in printer.namespace.globals if n != "torch" and n not in _NAMED_MODULES)
    if others:
        header.append("# Globals supplied by python_callable(): " + ", ".join(others))
    source = "\n".join(header + imports + ["", ""] + lines) + "\n"
    return PythonCode(source, printer.namespace.globals, trace.function_name)


def _children(spec) -> list:
    return spec.children() if hasattr(spec, "children") else spec.children_specs  # torch before 2.10


def _holds_size(spec) -> bool:
    """Whether an output tree spec has a ``torch.Size`` node (torch's pytree rebuilds it as a tuple)."""
    return spec.type is torch.Size or any(_holds_size(child) for child in _children(spec))


def _sizes_restored(tree, spec):
    """``tree`` with its ``torch.Size`` nodes rebuilt as ``torch.Size``, as the function returned
    them (``x.shape``), through tuples, lists and dicts."""
    if spec.type is torch.Size:
        return torch.Size(tree)
    children = _children(spec)
    if isinstance(tree, dict) and spec.type is dict:
        return {key: _sizes_restored(tree[key], child) for key, child in zip(spec.context, children)}
    if isinstance(tree, (tuple, list)) and spec.type in (tuple, list):
        return type(tree)(_sizes_restored(item, child) for item, child in zip(tree, children))
    return tree
