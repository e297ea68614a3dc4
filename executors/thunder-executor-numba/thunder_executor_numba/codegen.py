"""From a region's prims to the source of one Numba kernel.

The region is iterated over one shape S = (..., C). Every value is one of:

* FULL   -- shape S, read as ``x[i]`` (the region's tensors are made contiguous);
* ROW    -- one value per row (shape S[:-1] or S[:-1] + (1,)), read as ``x[r]``;
* COL    -- one value per column (shape (C,) broadcast along rows), read as ``x[c]``;
* SCALAR -- one value, read as ``x[0]``.

With symbolic sizes (a program compiled for changing shapes) the kernel takes the element
count ``n`` and the row length ``cols`` as arguments, read on each call from an input of the
iteration shape; sizes are compared by their expressions (``dims``), never as SymInts, which
would add guards to the program.

Regions without reductions become one flat parallel loop. Regions with reductions over the
last dim (RMSNorm, softmax, layer norm and their backwards) become a parallel loop over rows
with one inner pass per reduction level: FULL values are recomputed in each pass that needs
them (they are cheap) instead of being stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from thunder_core.extend import RegionNotSupported, TensorProxy, flatten_to_prims, size_hint
from thunder_core.extend import comparable_sizes as dims

FULL, ROW, COL, SCALAR = "full", "row", "col", "scalar"
DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.bool: "b8"}

UNARY = {
    "neg": "(-{a})",
    "abs": "abs({a})",
    "exp": "math.exp({a})",
    "log": "math.log({a})",
    "log1p": "math.log1p({a})",
    "expm1": "math.expm1({a})",
    "sin": "math.sin({a})",
    "cos": "math.cos({a})",
    "sqrt": "math.sqrt({a})",
    "rsqrt": "({one} / math.sqrt({a}))",
    "reciprocal": "({one} / {a})",
    "floor": "math.floor({a})",
    "ceil": "math.ceil({a})",
    "trunc": "math.trunc({a})",
    "logical_not": "(not {a})",
    "isnan": "({a} != {a})",
}
UNARY_F32 = {
    "tanh": "tanh32({a})",
    "erf": "erf32({a})",
    "sigmoid": "(f32(0.5) * tanh32(f32(0.5) * {a}) + f32(0.5))",
}
UNARY_F64 = {"tanh": "math.tanh({a})", "erf": "math.erf({a})", "sigmoid": "(1.0 / (1.0 + math.exp(-{a})))"}
BINARY = {
    "add": "({a} + {b})",
    "sub": "({a} - {b})",
    "mul": "({a} * {b})",
    "div": "({a} / {b})",
    "pow": "({a} ** {b})",
    "maximum": "maximum({a}, {b})",
    "minimum": "minimum({a}, {b})",
    "eq": "({a} == {b})",
    "ne": "({a} != {b})",
    "lt": "({a} < {b})",
    "le": "({a} <= {b})",
    "gt": "({a} > {b})",
    "ge": "({a} >= {b})",
    "bitwise_and": "({a} & {b})",
    "bitwise_or": "({a} | {b})",
    "bitwise_xor": "({a} ^ {b})",
}
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}
REDUCTIONS = {"sum": ("{t}(0)", "{acc} += {v}"), "amax": ("{t}(-math.inf)", "{acc} = maximum({acc}, {v})"),
              "amin": ("{t}(math.inf)", "{acc} = minimum({acc}, {v})")}  # fmt: skip
SHAPE_ONLY = {"broadcast_in_dim", "reshape", "squeeze"}
SUPPORTED = (
    set(UNARY)
    | set(UNARY_F32)
    | set(BINARY)
    | set(REDUCTIONS)
    | SHAPE_ONLY
    | {"where", "convert_element_type"}
)


class Unsupported(RegionNotSupported):
    """This region cannot be one Numba kernel (the reason is the message)."""


flatten_prims = flatten_to_prims


@dataclass
class Kernel:
    """A generated kernel: its source, and how to call it."""

    source: str
    name: str
    inputs: list  # region input proxies, in argument order
    outputs: list  # region output proxies, in argument order
    parallel: bool
    # With symbolic sizes: the input whose shape is the iteration shape, read on every call to
    # pass the kernel its element and column counts (``n``, ``cols``); None for fixed sizes.
    sizes_from: int | None = None


@dataclass
class _Value:
    kind: str
    level: int = 0
    reduction: str | None = None  # for reduction results: the prim name


@dataclass
class _Analysis:
    shape: tuple
    values: dict = field(default_factory=dict)  # name -> _Value
    prims: list = field(default_factory=list)


def is_symbolic(shape) -> bool:
    """Whether a shape has a size that is a symbol's expression (not a number)."""
    return any(not isinstance(d, int) for d in dims(shape))


def one_element(x) -> bool:
    """Whether ``x`` holds one element (a symbolic size is never 1: sizes 0 and 1 are fixed)."""
    return all(d == 1 for d in dims(x.shape))


def numel_hint(x) -> int:
    """``x.numel()``, with each symbolic size at the value it had when the trace was captured
    (for heuristics only: which tensor is the largest, whether to run in parallel)."""
    return math.prod(size_hint(s) for s in x.shape)


def _iteration_shape(prims, inputs) -> tuple:
    tensors = [p for b in prims for p in b.flat_outputs()] + list(inputs)
    biggest = max(tensors, key=numel_hint)
    return dims(biggest.shape)


def _is_row_shape(shape, S) -> bool:
    return len(S) > 0 and dims(shape) in (S[:-1], S[:-1] + (1,))


def analyze(bsyms, inputs) -> _Analysis:
    prims = list(flatten_prims(bsyms))
    if not prims:
        raise Unsupported("empty region")
    S = _iteration_shape(prims, inputs)
    analysis = _Analysis(S, prims=prims)
    values = analysis.values
    C = S[-1] if S else 1

    def known(x) -> _Value | None:
        return values.get(x.name) if isinstance(x, TensorProxy) else None

    def classify_input(x, expected_kind: str) -> _Value:
        found = known(x)
        if found is not None:
            return found
        if one_element(x):
            kind = SCALAR
        elif expected_kind == FULL and dims(x.shape) == S:
            kind = FULL
        elif expected_kind == ROW and _is_row_shape(x.shape, S):
            kind = ROW
        elif expected_kind == COL and dims(x.shape) == (C,):
            kind = COL
        else:
            raise Unsupported(f"input {x.name} of shape {tuple(x.shape)} does not fit iteration shape {S}")
        values[x.name] = _Value(kind)
        return values[x.name]

    def join(kinds) -> str:
        kinds = set(kinds) - {SCALAR}
        if not kinds:
            return SCALAR
        if len(kinds) == 1:
            return kinds.pop()
        if kinds <= {ROW, COL, FULL}:
            return FULL
        raise Unsupported(f"cannot combine {kinds}")

    for b in prims:
        name = b.symbol.name
        if name not in SUPPORTED:
            raise Unsupported(f"prims.{name} is not supported")
        out = b.flat_outputs()
        if len(out) != 1 or not isinstance(out[0], TensorProxy):
            raise Unsupported(f"prims.{name} has {len(out)} outputs")
        out = out[0]
        if out.dtype not in DTYPES:
            raise Unsupported(f"dtype {out.dtype}")
        tensors = [x for x in b.args if isinstance(x, TensorProxy)]
        if name in REDUCTIONS:
            source = classify_input(b.args[0], FULL)
            reduced = tuple(b.args[1])
            if source.kind != FULL or reduced != (len(S) - 1,):
                raise Unsupported(f"prims.{name} over dims {reduced} (only the last dim of {S} fuses)")
            values[out.name] = _Value(ROW, source.level + 1, name)
        elif name == "broadcast_in_dim":
            a, shape, along_dims = b.args
            shape, along_dims = dims(shape), tuple(along_dims)
            if shape != S and not _is_row_shape(shape, S):
                raise Unsupported(f"broadcast to {shape}")
            if known(a) is not None:
                source = known(a)
            elif one_element(a):
                source = classify_input(a, SCALAR)
            elif dims(a.shape) == (C,) and along_dims == (len(S) - 1,) and shape == S:
                source = classify_input(a, COL)
            elif _is_row_shape(a.shape, S) and along_dims == tuple(range(a.ndim)):
                source = classify_input(a, ROW)
            elif dims(a.shape) == S:
                source = classify_input(a, FULL)
            else:
                raise Unsupported(f"broadcast of {tuple(a.shape)} along {along_dims}")
            if _is_row_shape(shape, S) and source.kind not in (ROW, SCALAR):
                raise Unsupported("broadcast into a row shape")
            along = {ROW: tuple(range(a.ndim)), COL: (len(S) - 1,)}.get(source.kind, along_dims)
            if shape == S and along_dims != along:
                raise Unsupported(f"a {source.kind} value broadcast along {along_dims}")
            values[out.name] = _Value(source.kind, source.level)
        elif name in ("reshape", "squeeze"):
            a = b.args[0]
            source = known(a) or classify_input(a, FULL if dims(a.shape) == S else ROW)
            fits = (source.kind == FULL and dims(out.shape) == S) or (
                source.kind in (ROW, SCALAR) and (_is_row_shape(out.shape, S) or one_element(out))
            )
            if not fits:
                raise Unsupported(f"reshape of {tuple(a.shape)} to {tuple(out.shape)}")
            values[out.name] = _Value(source.kind, source.level)
        else:
            expected = FULL if dims(out.shape) == S else ROW
            if one_element(out) and dims(out.shape) != S:
                expected = SCALAR
            elif expected == ROW and dims(out.shape) == (C,) and len(S) > 1:
                if not _is_row_shape(out.shape, S):
                    expected = COL
                elif not all(known(x) for x in tensors):
                    # S[:-1] == (C,): whether a region input is per row or per column only
                    # shows where it is broadcast later.
                    raise Unsupported(f"shape {tuple(out.shape)} could be per row or per column of {S}")
            operands = [classify_input(x, expected) for x in tensors]
            kind = join(v.kind for v in operands)
            if kind == FULL and dims(out.shape) != S:  # e.g. a per-row and a per-column value of a square S
                raise Unsupported(f"prims.{name} of shape {tuple(out.shape)} combines values of shape {S}")
            values[out.name] = _Value(kind, max((v.level for v in operands), default=0))
    return analysis


def _literal(x, dtype) -> str:
    code = DTYPES[dtype]
    if isinstance(x, bool):
        return "True" if x else "False"
    if dtype == torch.bool:
        return "True" if x else "False"
    if isinstance(x, float) and not math.isfinite(x):
        return f"{code}({'math.inf' if x > 0 else '-math.inf'})" if not math.isnan(x) else f"{code}(math.nan)"
    return f"{code}({x!r})"


def generate(bsyms, inputs, outputs, *, parallel: bool, name: str) -> Kernel:
    analysis = analyze(bsyms, inputs)
    S, values, prims = analysis.shape, analysis.values, analysis.prims
    sizes_from = None
    if is_symbolic(S):  # the loop bounds are the kernel's arguments, read from an input per call
        sizes_from = next((k for k, p in enumerate(inputs) if dims(p.shape) == S), None)
        if sizes_from is None:
            raise Unsupported(f"symbolic sizes: no input of the iteration shape {S} to read them from")
        C, N, R = "cols", "n", "(n // cols)"
    else:
        C = S[-1] if S else 1
        N = math.prod(S)
        R = N // C if C else 0
    produced = {p.name: b for b in prims for p in b.flat_outputs()}
    input_index = {p.name: k for k, p in enumerate(inputs)}
    for p in outputs:
        if p.name not in values:
            raise Unsupported(f"output {p.name} is not computed in the region")
        if values[p.name].kind == COL:
            raise Unsupported(f"output {p.name} has one value per column")
    has_reductions = any(v.reduction for v in values.values())
    index = {FULL: "i", ROW: "r", COL: "c", SCALAR: "0"}

    def operand(x, dtype, emitted, lines, indent) -> str:
        if isinstance(x, (torch.SymFloat, torch.SymBool)):
            raise Unsupported(f"the symbolic number {x} in a kernel")
        if isinstance(x, torch.SymInt):  # a size as a number (a mean divides by the row length)
            (size,) = dims((x,))
            if isinstance(size, int):
                return _literal(size, dtype)
            if sizes_from is None or size != S[-1]:
                raise Unsupported(f"the size {x} as a number in a kernel (only the row length is passed)")
            return f"{DTYPES[dtype]}(cols)" if dtype != torch.bool else "(cols != 0)"
        if not isinstance(x, TensorProxy):
            return _literal(x, dtype)
        if x.name in input_index:
            kind = values[x.name].kind if x.name in values else SCALAR
            return f"in{input_index[x.name]}[{index[kind]}]"
        return expression(x, emitted, lines, indent)

    def expression(x, emitted, lines, indent) -> str:
        """The local holding ``x``, emitting the code that computes it if needed."""
        var = f"v_{x.name}"
        if x.name in emitted:
            return var
        b = produced[x.name]
        op = b.symbol.name
        out_dtype = x.dtype
        if op in SHAPE_ONLY:
            text = operand(b.args[0], out_dtype, emitted, lines, indent)
        elif op == "convert_element_type":
            source = operand(b.args[0], out_dtype, emitted, lines, indent)
            text = f"({source} != 0)" if out_dtype == torch.bool else f"{DTYPES[out_dtype]}({source})"
        elif op == "where":
            c, a, bb = b.args
            c_text = operand(c, torch.bool, emitted, lines, indent)
            a_text = operand(a, out_dtype, emitted, lines, indent)
            b_text = operand(bb, out_dtype, emitted, lines, indent)
            text = f"({a_text} if {c_text} else {b_text})"
        elif op in BINARY:
            a, bb = b.args[:2]
            operand_dtype = out_dtype
            if op in COMPARISONS or op.startswith("bitwise"):
                operand_dtype = next((t.dtype for t in (a, bb) if isinstance(t, TensorProxy)), out_dtype)
            a_text = operand(a, operand_dtype, emitted, lines, indent)
            b_text = operand(bb, operand_dtype, emitted, lines, indent)
            if op == "pow" and isinstance(bb, (int, float)) and bb == 2:
                text = f"({a_text} * {a_text})"
            else:
                text = BINARY[op].format(a=a_text, b=b_text)
        else:
            a_text = operand(b.args[0], out_dtype, emitted, lines, indent)
            table = UNARY_F32 if out_dtype == torch.float32 else UNARY_F64
            template = table.get(op) or UNARY[op]
            text = template.format(a=a_text, one=_literal(1, out_dtype))
        lines.append(f"{indent}{var} = {text}")
        emitted.add(x.name)
        return var

    params = [f"in{k}" for k in range(len(inputs))] + [f"out{k}" for k in range(len(outputs))]
    if sizes_from is not None:
        params += ["n", "cols"]
    loop = "numba.prange" if parallel else "range"
    lines = [f"@numba.njit(parallel={parallel}, fastmath=FASTMATH, error_model='numpy', cache=True)"]
    lines.append(f"def {name}({', '.join(params)}):")
    if not has_reductions:
        lines.append(f"    for i in {loop}({N}):")
        lines.append(f"        r = i // {C}")
        lines.append(f"        c = i - r * {C}")
        emitted: set[str] = set()
        for k, p in enumerate(outputs):
            v = operand(p, p.dtype, emitted, lines, "        ")
            target = "i" if dims(p.shape) == S else ("r" if values[p.name].kind == ROW else "0")
            lines.append(f"        out{k}[{target}] = {v}")
        return Kernel("\n".join(lines) + "\n", name, list(inputs), list(outputs), parallel, sizes_from)

    # Row mode: one pass per reduction level.
    # An output of the iteration shape is written element by element (a per-row value broadcast
    # to the full shape too); a per-row one once per row, a one-element one once.
    full_outputs = [(k, p) for k, p in enumerate(outputs) if dims(p.shape) == S]
    row_outputs = [(k, p) for k, p in enumerate(outputs) if (k, p) not in full_outputs]
    for _, p in row_outputs:
        if not (_is_row_shape(p.shape, S) or one_element(p)):
            raise Unsupported(
                f"output {p.name} of shape {tuple(p.shape)} is neither per row nor per element of {S}"
            )
    reductions = [(produced[n], n) for n, v in values.items() if v.reduction]
    levels = [values[b.args[0].name].level for b, _ in reductions]
    last_pass = max([values[p.name].level for _, p in full_outputs] + levels + [0])
    lines.append(f"    for r in {loop}({R}):")
    lines.append(f"        base = r * {C}")
    row_emitted: set[str] = set()
    stored: set[int] = set()

    row_values = [n for n, v in values.items() if v.kind in (ROW, SCALAR) and n in produced]

    def emit_rows(level_limit: int) -> None:
        """Row values computable before pass ``level_limit``: once per row, outside the inner loop."""
        for n in row_values:
            if n not in row_emitted and values[n].level <= level_limit and not values[n].reduction:
                expression(produced[n].flat_outputs()[0], row_emitted, lines, "        ")
        for k, p in row_outputs:
            if k not in stored and values[p.name].level <= level_limit:
                v = operand(p, p.dtype, row_emitted, lines, "        ")
                if _is_row_shape(p.shape, S):
                    lines.append(f"        out{k}[r] = {v}")
                else:  # one element: the same value in every row
                    lines.append("        if r == 0:")
                    lines.append(f"            out{k}[0] = {v}")
                stored.add(k)

    for level in range(last_pass + 1):
        emit_rows(level)
        accumulators = []
        for (b, n), source_level in zip(reductions, levels):
            if source_level == level:
                acc = f"acc_{n}"
                init, _ = REDUCTIONS[b.symbol.name]
                lines.append(f"        {acc} = {init.format(t=DTYPES[b.flat_outputs()[0].dtype])}")
                accumulators.append((b, n, acc))
        lines.append(f"        for c in range({C}):")
        lines.append("            i = base + c")
        emitted = set(row_emitted)
        body_indent = "            "
        for b, _n, acc in accumulators:
            v = operand(b.args[0], b.args[0].dtype, emitted, lines, body_indent)
            _, update = REDUCTIONS[b.symbol.name]
            lines.append(f"{body_indent}{update.format(acc=acc, v=v)}")
        for k, p in full_outputs:
            if values[p.name].level == level:
                v = operand(p, p.dtype, emitted, lines, body_indent)
                lines.append(f"{body_indent}out{k}[i] = {v}")
        if lines[-1].endswith("i = base + c"):
            lines.append(f"{body_indent}pass")
        for _b, n, acc in accumulators:
            lines.append(f"        v_{n} = {acc}")
            row_emitted.add(n)
    emit_rows(last_pass + 1)
    return Kernel("\n".join(lines) + "\n", name, list(inputs), list(outputs), parallel, sizes_from)


PRELUDE = """import math

import numba
import numpy as np
from numpy import bool_ as b8, float32 as f32, float64 as f64

from thunder_executor_numba.mathlib import erf32, tanh32

FASTMATH = {"contract", "arcp", "nsz", "reassoc", "afn"}


@numba.njit(inline="always", cache=True)
def maximum(a, b):
    return a if (a > b or a != a) else b


@numba.njit(inline="always", cache=True)
def minimum(a, b):
    return a if (a < b or a != a) else b


"""
