"""Symbolic sizes in traces: PyTorch's SymInts, printed readably and bound from the inputs.

A trace compiled for changing sizes has proxies whose sizes are ``torch.SymInt`` of a
``ShapeEnv`` (``thunder_core.capture.symbolic``). Its printed program names each size symbol
``s0, s1, ...`` in the order the inputs introduce them, binds it from an input's size at the
top of the function (``s0 = x.shape[0]``; ``size_symbols``), and prints size expressions as Python
(``(s0 // 2)``) through torch's own printer.
"""

from __future__ import annotations

import torch

from thunder_core.ir.tree import leaves

SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(value) -> bool:
    """A SymInt, SymFloat or SymBool whose value is not a constant."""
    return isinstance(value, SYMBOLIC_TYPES) and value.node.expr.free_symbols != set()


def has_symbolic_shape(x) -> bool:
    """A tensor (proxy) with a symbolic size or stride."""
    return isinstance(x, torch.Tensor) and (
        any(isinstance(s, torch.SymInt) for s in x.shape)
        or any(isinstance(s, torch.SymInt) for s in x.stride())
    )


def known_equal(a, b) -> bool:
    """Whether two sizes are equal for every value of their symbols, without adding a guard
    (False when it depends on the sizes)."""
    if not isinstance(a, SYMBOLIC_TYPES) and not isinstance(b, SYMBOLIC_TYPES):
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(a == b)


def hint(value) -> int | float | bool:
    """The value a symbolic size had when the trace was captured (for heuristics, never for
    decisions that change the program: those must go through the ShapeEnv, which guards them)."""
    if isinstance(value, SYMBOLIC_TYPES):
        node = value.node
        return node.hint if node.hint is not None else node.shape_env.size_hint(node.expr)
    return value


def expression(value):
    """The sympy expression of a SymInt/SymFloat/SymBool (its value if constant)."""
    return value.node.expr


def comparable_sizes(sizes) -> tuple:
    """Sizes (or strides) to compare without adding a guard: ints as they are, a symbolic size as
    its sympy expression (an int when it is constant). Two such sizes are equal when they are
    equal for every value of the symbols; comparing the SymInts themselves would ask the
    ``ShapeEnv``, which records the answer as a guard of the trace (and may fix the size)."""
    out = []
    for size in sizes:
        if isinstance(size, torch.SymInt):
            expr = size.node.expr
            size = int(expr) if expr.is_Integer else expr
        out.append(size)
    return tuple(out)


def same_sizes(a, b) -> bool:
    """Whether two shapes (or stride tuples) are the same expressions (then equal for every value
    of their symbols; False when unsure: ``2*(s0 + 1)`` against ``2*s0 + 2``), without adding a
    guard: for the checks that only choose a shortcut (no broadcast, no reshape needed),
    where comparing the SymInts would record a guard (``(2,) == (s0, 2)`` compares ``2 == s0``
    first, and fixes ``s0`` to 2 when it was 2 at capture)."""
    a, b = tuple(a), tuple(b)
    if len(a) != len(b):
        return False
    if all(type(size) is int for size in a) and all(type(size) is int for size in b):
        return a == b
    return comparable_sizes(a) == comparable_sizes(b)


def name_symbols(shape_env, symbols) -> None:
    """Name ``symbols`` (sympy symbols of ``shape_env``) ``s0, s1, ...`` in this order, after
    those named before: the names every trace of that environment prints."""
    import sympy

    names = shape_env.__dict__.setdefault("thunder_core_names", {})
    for symbol in symbols:
        if symbol not in names:
            names[symbol] = sympy.Symbol(f"s{len(names)}", integer=True, positive=True)


def size_symbols(inputs) -> list[tuple[object, torch.SymInt, str]]:
    """``(symbol, a SymInt of its ShapeEnv, Python reading its value from an input)`` for each
    size symbol the inputs give, first occurrence only, in input order: the bindings at the top
    of a printed trace.

    A symbol is read from an int input that is the symbol (``n``), else from a dimension that is
    the symbol itself (``x.shape[1]``), else from a
    stride that is (a slice of a longer buffer: ``x.stride(0)``), else solved from a dimension
    that is a multiple of it plus a constant (a backward whose inputs are flattened:
    ``x.shape[0] // 2`` for ``2*s0``).
    """
    found, seen = [], set()
    tensors = [p for p in inputs if isinstance(p, torch.Tensor)]
    for p in inputs:  # an int input taken symbolic (a NumberProxy holding a SymInt) is its symbol
        value = getattr(p, "value", None) if not isinstance(p, torch.Tensor) else None
        if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol and value.node.expr not in seen:
            seen.add(value.node.expr)
            found.append((value.node.expr, value, p.name))
    for kind in ("shape", "stride", "linear"):
        for proxy in tensors:
            for dim, size in enumerate(proxy.stride() if kind == "stride" else proxy.shape):
                if not isinstance(size, torch.SymInt):
                    continue
                expr = size.node.expr
                if kind != "linear":
                    if expr.is_Symbol and expr not in seen:
                        seen.add(expr)
                        read = f"shape[{dim}]" if kind == "shape" else f"stride({dim})"
                        found.append((expr, size, f"{proxy.name}.{read}"))
                    continue
                solved = solve_linear(expr)
                if solved is not None and solved[0] not in seen:
                    symbol, scale, offset = solved
                    seen.add(symbol)
                    read = f"{proxy.name}.shape[{dim}]"
                    if offset:
                        read = f"({read} {'-' if offset > 0 else '+'} {abs(offset)})"
                    found.append((symbol, size, read if scale == 1 else f"{read} // {scale}"))
    return found


def symbol_value(symbol, size: torch.SymInt) -> torch.SymInt | None:
    """A SymInt that is exactly ``symbol``, from ``size``, a SymInt of ``scale * symbol + offset``
    (``size_symbols``' linear case); None for any other expression."""
    solved = solve_linear(size.node.expr)
    if solved is None or solved[0] != symbol:
        return None
    _, scale, offset = solved
    value = (size - offset) // scale if scale != 1 else size - offset
    return value if isinstance(value, torch.SymInt) and value.node.expr == symbol else None


def mentioned_symbols(values) -> set:
    """The size symbols that ``values`` mention: symbolic sizes, and the sizes and strides of
    tensors (proxies) and slice bounds, in any nesting of tuples, lists and dicts."""
    found: set = set()
    for value in leaves(values):
        if isinstance(value, slice):
            found |= mentioned_symbols([value.start, value.stop, value.step])
        elif isinstance(value, SYMBOLIC_TYPES):
            found |= value.node.expr.free_symbols
        elif isinstance(value, torch.Tensor):
            for size in (*value.shape, *value.stride()):
                if isinstance(size, torch.SymInt):
                    found |= size.node.expr.free_symbols
    return found


def symbols_used_by(bsyms) -> set:
    """The size symbols that bound symbols (and their subsymbols) mention in their arguments and outputs."""
    found: set = set()
    for b in bsyms:
        found |= mentioned_symbols((b.args, b.kwargs, b.output))
        if b.subsymbols:
            found |= symbols_used_by(b.subsymbols)
    return found


def solve_linear(expr) -> tuple | None:
    """``(symbol, scale, offset)`` when the sympy size expression ``expr`` is ``scale * symbol +
    offset`` with integers, scale > 0: the symbol is ``(value - offset) // scale``."""
    if len(expr.free_symbols) != 1:
        return None
    (symbol,) = expr.free_symbols
    scale = expr.coeff(symbol)
    offset = expr - scale * symbol
    if scale.is_Integer and scale > 0 and offset.is_Integer:
        return symbol, int(scale), int(offset)
    return None


def symbol_source(symbol, value: torch.SymInt) -> str:
    """The printed name of the size symbol ``symbol`` of ``value``'s ShapeEnv (``s0``)."""
    names = getattr(value.node.shape_env, "thunder_core_names", {})
    return str(names.get(symbol, symbol))


def source(value, strict: bool = True) -> str:
    """Python source of a size (an int, or a SymInt/SymFloat/SymBool as an expression of the
    named size symbols: ``s0``, ``(s0 // 2)``, ``2*s1``). Not ``strict``: a symbol not named
    yet (while capturing) prints as the ShapeEnv calls it."""
    if not isinstance(value, SYMBOLIC_TYPES):
        return repr(value)
    from torch.utils._sympy.printers import PythonPrinter

    expr = value.node.expr
    names = getattr(value.node.shape_env, "thunder_core_names", {})
    missing = expr.free_symbols - set(names)
    if missing and strict:
        raise SymbolicSizeError(
            f"the size expression {expr} uses {', '.join(sorted(map(str, missing)))}, which no input's size gives"
        )
    return PythonPrinter().doprint(expr.xreplace(names))


class SymbolicSizeError(RuntimeError):
    """A symbolic trace that cannot be printed as a program of its inputs' sizes."""
