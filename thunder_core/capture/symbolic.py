"""Capturing with symbolic sizes: PyTorch's ``ShapeEnv`` and fake tensors.

``SymbolicSizes`` gives the chosen dimensions of a capture's input tensors symbolic sizes
(``torch.SymInt`` of one ``ShapeEnv``), so that the proxies carry them, torch's fake kernels
propagate them through every operation, and a Python branch of the program on a size records a
guard in the environment. After capture, ``SizeGuard`` checks a later call's inputs against the
sizes, strides and guards the trace holds for (``ShapeEnv.produce_guards_expression``).

Sizes 0 and 1 are specialized (PyTorch's default): a trace compiled with a symbolic size holds
for sizes of 2 and more, and a call with size 1 compiles its own trace.
"""

from __future__ import annotations

import contextvars
import re
from contextlib import contextmanager, nullcontext

import torch

from thunder_core.capture.symbolic_python import as_eager_values
from thunder_core.ir.proxies import NumberProxy
from thunder_core.ir.symbolic import name_symbols, size_symbols

_active: contextvars.ContextVar[SymbolicSizes | None] = contextvars.ContextVar("symbolic_sizes", default=None)


def active() -> SymbolicSizes | None:
    """The symbolic sizes of the capture running in this context, if any."""
    return _active.get()


def sizes_of(values) -> SymbolicSizes | None:
    """The symbolic sizes in force for an operation on ``values``: the capture's, or else those
    of a symbolic size among them (autodiff and later passes record operations too)."""
    sizes = _active.get()
    if sizes is not None:
        return sizes
    for value in values:
        if isinstance(value, NumberProxy):
            value = value.value  # an int input the trace takes symbolic holds its SymInt
        if isinstance(value, torch.Tensor):
            sizes = (*value.shape, *value.stride())
        elif isinstance(value, slice):  # x[:n] with a symbolic int
            sizes = (value.start, value.stop, value.step)
        else:
            sizes = (value,)
        for size in sizes:
            if isinstance(size, torch.SymInt):
                return getattr(size.node.shape_env, "thunder_core_sizes", None)
    return None


class SymbolicSizes:
    """One capture's ``ShapeEnv``: symbolic sizes for ``dims[input position]`` of its inputs,
    symbolic strides for the tensors at the positions ``strides``, and symbolic values for its int
    inputs at the positions ``ints``."""

    def __init__(
        self,
        dims: dict[int, frozenset[int]],
        ints: frozenset[int] = frozenset(),
        strides: frozenset[int] = frozenset(),
    ):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.dims = dims
        self.ints = ints
        self.strides = strides
        self.user_python = True  # the captured code may test its values (symbolic_python); not an FX graph
        self.int_values: dict[int, object] = {}  # input position -> its SymInt (or int, if specialized)
        self.shape_env = ShapeEnv()
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=False)
        self.fakes: dict[int, torch.Tensor] = {}  # input position -> its fake tensor
        self.names: dict[int, str] = {}  # input position -> its name in the trace
        self._outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(proxy) -> (proxy, fake)
        self.memo: dict[tuple, object] = {}  # operations' output metadata (capture.meta), by call
        self.shape_env.thunder_core_sizes = self

    def metadata(self, tensor: torch.Tensor, position: int, name: str):
        """``(shape, strides)`` of the input at ``position``: symbolic in its chosen dims."""
        dims = self.dims.get(position, frozenset())
        if not dims and position not in self.strides:
            return tensor.shape, tensor.stride()
        from torch._dynamo.source import LocalSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

        strides = None  # inferred from the sizes where they are contiguous, else symbols of their own
        if position in self.strides:  # its strides alone change: each a symbol, a unit stride kept
            strides = [DimDynamic.INFER_STRIDE if s == 1 else DimDynamic.DYNAMIC for s in tensor.stride()]
        context = StatelessSymbolicContext(
            dynamic_sizes=[
                DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(tensor.dim())
            ],
            dynamic_strides=strides,
        )
        stand_in = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
        fake = self.fake_mode.from_tensor(stand_in, symbolic_context=context, source=LocalSource(name))
        self.fakes[position] = fake
        self.names[position] = name
        return fake.shape, fake.stride()

    def number(self, value: int, position: int, name: str):
        """The int input at ``position``: a ``SymInt`` if it is one of ``ints`` (its value is the
        hint, and the program's comparisons on it become guards), else ``value`` itself. Unlike a
        size it may be negative: nothing is assumed of its sign (0 and 1 are specialized, and the
        callers leave them fixed)."""
        if position not in self.ints or type(value) is not int:
            return value
        from torch._dynamo.source import LocalSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        source = LocalSource(name)
        symbol = self.shape_env.create_symbol(
            value, source=source, dynamic_dim=DimDynamic.DYNAMIC, positive=None
        )
        symint = self.shape_env.create_symintnode(symbol, hint=value, source=source)
        self.int_values[position] = symint
        self.names[position] = name
        return symint

    def symbolic_ints(self) -> frozenset[int]:
        """The positions of the int inputs that are still symbolic (not specialized by the program)."""
        return frozenset(
            p for p, v in self.int_values.items() if isinstance(v, torch.SymInt) and v.node.expr.free_symbols
        )

    def name_sizes(self, inputs) -> None:
        """Name the size symbols ``s0, s1, ...`` in the order the trace's inputs bind them (after
        capture: sizes the program found equal share one symbol)."""
        name_symbols(self.shape_env, [symbol for symbol, _, _ in size_symbols(inputs)])

    def fake(self, x):
        """A fake tensor with ``x``'s (possibly symbolic) metadata, for running an operation (an
        int input's ``NumberProxy``: its value, a SymInt)."""
        if isinstance(x, NumberProxy):
            return x.value
        if isinstance(x, torch.Tensor):
            with self.fake_mode:
                return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        return x

    def remember(self, proxy: torch.Tensor, fake: torch.Tensor) -> None:
        """Keep ``fake``, the operation output ``proxy`` was made from, as its stand-in for the
        operations that take it, until the capture ends (a new fake with symbolic sizes costs
        PyTorch's symbolic arithmetic on every size and stride)."""
        if _active.get() is self:
            self._outputs[id(proxy)] = (proxy, fake)

    def stand_in(self, proxy: torch.Tensor) -> torch.Tensor:
        """A fake tensor for running an operation on ``proxy``: the output it was made from, while
        capturing, when that still fits it; else a new one (``fake``)."""
        found = self._outputs.get(id(proxy))
        if found is not None and found[0] is proxy and found[1].requires_grad == proxy.requires_grad:
            return found[1]
        return self.fake(proxy)

    def is_symbolic(self) -> bool:
        """Whether any chosen dimension, stride or int is still symbolic (not specialized by the
        program)."""
        return bool(self.symbolic_ints()) or any(
            isinstance(s, torch.SymInt) and s.node.expr.free_symbols
            for fake in self.fakes.values()
            for s in (*fake.shape, *fake.stride())
        )

    def guard(self) -> SizeGuard:
        return SizeGuard(self)


def symbolic_examples(proxies) -> list[torch.Tensor] | None:
    """Fake tensors standing for ``proxies`` with their symbolic sizes, in the ``ShapeEnv`` of the
    trace they come from; None when none of them has a symbolic size.

    For an executor that takes symbolic sizes (``takes_symbolic_sizes``) and compiles a region
    once for every size: tracing its function on these (``make_fx(fn, tracing_mode="fake")``)
    gives a graph whose sizes are the trace's symbols, and anything that tracing or compiling
    assumes about them becomes a guard of the compiled trace, checked on every new size.
    """
    sizes = sizes_of(proxies)
    if sizes is None:
        return None
    return [sizes.fake(p) for p in proxies]


def _ours(value) -> bool:
    """Whether ``value`` is a symbolic size or int of the capture running in this context."""
    sizes = _active.get()
    return sizes is not None and getattr(value.node, "shape_env", None) is sizes.shape_env


@contextmanager
def capturing_symbolically(sizes: SymbolicSizes | None):
    token = _active.set(sizes)
    # FakeTensorMode's dispatch cache costs more than it saves here: building an entry for
    # symbolic sizes is symbolic arithmetic on all of them, and the capture's own memo
    # (capture.meta) already answers the operations it repeats. Left as it was after capture.
    cache_was = sizes is not None and sizes.fake_mode.cache_enabled
    if sizes is not None:
        sizes.fake_mode.cache_enabled = False
    try:
        with as_eager_values(_ours) if sizes is not None and sizes.user_python else nullcontext():
            yield
    finally:
        _active.reset(token)
        if sizes is not None:
            sizes._outputs.clear()
            sizes.fake_mode.cache_enabled = cache_was


def guard_globals() -> dict:
    """What guard expressions may call: the functions torch's guard printer writes."""
    import math

    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    return {**SYMPY_INTERP, "math": math}


class _Sizes:
    """What a guard expression reads of a tensor: sizes, strides, and no storage offset (a
    trace does not depend on where its inputs' data starts)."""

    __slots__ = ("_size", "_stride")

    def __init__(self, tensor: torch.Tensor):
        self._size, self._stride = tensor.shape, tensor.stride()

    def size(self):
        return self._size

    def stride(self):
        return self._stride

    def storage_offset(self) -> int:
        return 0

    def dim(self) -> int:
        return len(self._size)


_SIZE = re.compile(r"L\['t(\d+)'\]\.size\(\)\[(\d+)\]")
_STRIDE = re.compile(r"L\['t(\d+)'\]\.stride\(\)\[(\d+)\]")
_OFFSET = re.compile(r"L\['t(\d+)'\]\.storage_offset\(\)")
_NUMBER = re.compile(r"L\['t(\d+)'\](?![.\[])")


def _reading_each_tensor_once(expression: str, positions: list[int], ndims: list[int | None]):
    """``expression`` (torch's printed guard on ``L['t0'].size()[2]``, ``L['t1']``, ...) as a
    function of the call's leaves that reads each tensor's sizes and strides once into locals:
    the same conditions, without a lookup and a call per size. ``ndims``: each placeholder's
    number of dimensions, None for an int. None when the expression reads anything else of the
    tensors (then the printed expression is evaluated as it is)."""
    body = _NUMBER.sub(r"n\1", _OFFSET.sub("0", _STRIDE.sub(r"y\1[\2]", _SIZE.sub(r"z\1[\2]", expression))))
    if "L[" in body:
        return None
    lines = ["def size_guard(leaves):"]
    lines += [f"    a{i} = leaves[{p}]" for i, p in enumerate(positions)]
    typed = " and ".join(
        f"type(a{i}) is int" if n is None else f"isinstance(a{i}, Tensor) and a{i}.dim() == {n}"
        for i, n in enumerate(ndims)
    )
    lines.append(f"    if not ({typed or 'True'}):")
    lines.append("        return False")
    for i, n in enumerate(ndims):
        if n is None:
            lines.append(f"    n{i} = a{i}")
            continue
        lines.append(f"    z{i} = a{i}.shape")
        if f"y{i}[" in body:
            lines.append(f"    y{i} = a{i}.stride()")
    lines += ["    try:", f"        return bool({body})", "    except Exception:", "        return False"]
    namespace = {**guard_globals(), "Tensor": torch.Tensor}
    exec(compile("\n".join(lines), "<thunder_core size guard>", "exec"), namespace)  # noqa: S102
    return namespace["size_guard"]


class SizeGuard:
    """Whether a call's tensors and ints fit a symbolic trace: the tensors' dims in number, static
    sizes and strides equal, symbolic sizes and ints satisfying every guard the capture recorded."""

    def __init__(self, sizes: SymbolicSizes):
        self.sizes = sizes
        positions = sorted({*sizes.fakes, *sizes.int_values})
        placeholders = [sizes.fakes[p] if p in sizes.fakes else sizes.int_values[p] for p in positions]
        self.positions = positions
        self._input_names = [sizes.names[p] for p in positions]
        self.expression = (
            sizes.shape_env.produce_guards_expression(placeholders, ignore_static=False) or "True"
        )
        self._ndims = [p.dim() if isinstance(p, torch.Tensor) else None for p in placeholders]
        self.is_symbolic = sizes.is_symbolic()  # False when the program fixed every symbolic size
        self._check = eval(
            compile(f"lambda L: {self.expression}", "<thunder_core size guard>", "eval"), guard_globals()
        )
        self._names = [f"t{i}" for i in range(len(positions))]
        self._reads_once = _reading_each_tensor_once(self.expression, positions, self._ndims)

    def taken_again(self) -> SizeGuard:
        """The guard of the same sizes with every guard their ShapeEnv holds now (one added since,
        when the program was specialized on a size after its capture)."""
        return SizeGuard(self.sizes)

    def __call__(self, leaves) -> bool:
        if self._reads_once is not None:
            return self._reads_once(leaves)
        return self.evaluate(leaves)

    def _values(self, leaves) -> dict | None:
        """What the printed expression reads, by placeholder name; None when a leaf is of another kind."""
        values = {}
        for name, position, ndim in zip(self._names, self.positions, self._ndims):
            leaf = leaves[position]
            if ndim is None:
                if type(leaf) is not int:
                    return None
                values[name] = leaf
            elif not isinstance(leaf, torch.Tensor) or leaf.dim() != ndim:
                return None
            else:
                values[name] = _Sizes(leaf)
        return values

    def evaluate(self, leaves) -> bool:
        """The guard as torch prints it, evaluated on the tensors' sizes and strides and the ints."""
        values = self._values(leaves)
        if values is None:
            return False
        try:
            return bool(self._check(values))
        except Exception:  # noqa: BLE001 - a guard it cannot evaluate is a guard that does not hold
            return False

    def failing(self, leaves) -> str:
        """The first of the guard's conditions that ``leaves`` fail (``cache_info`` names it)."""
        values = self._values(leaves)
        if values is None:
            return "the number of dimensions, or an int argument's type"
        for condition in self.expression.split(" and "):
            try:
                holds = eval(compile(f"lambda L: {condition}", "<size guard>", "eval"), guard_globals())(
                    values
                )
            except Exception:  # noqa: BLE001
                holds = False
            if not holds:
                for name, input_name in zip(self._names, self._input_names):
                    condition = condition.replace(f"L['{name}'].size()", f"{input_name}.shape")
                    condition = condition.replace(f"L['{name}']", input_name)
                return condition
        return "the number of dimensions"
