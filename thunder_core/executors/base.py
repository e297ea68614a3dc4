"""The executor API: who may run an operation, and how.

An ``OperatorExecutor`` registers implementations per symbol, each with an optional
checker. A ``FusionExecutor`` registers the symbols it can fuse; after claiming, its
``fusion_pass`` groups neighbouring claimed operations into regions and compiles each
region once. A checker gets the bound symbol's arguments (proxies) and returns ``True`` or
a ``Rejection`` carrying the reason; results are cached per (symbol, input metadata).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from thunder_core.executors.fusion import fuse_regions
from thunder_core.executors.regions import Region, RegionNotSupported, flatten_to_prims
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbolic import SYMBOLIC_TYPES, has_symbolic_shape
from thunder_core.ir.symbols import INPLACE, BoundSymbol, Symbol
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves


@dataclass(frozen=True)
class Rejection:
    """A checker's "no", with the reason ``explain`` shows."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.reason


__all__ = [
    "Checker",
    "Executor",
    "FusionExecutor",
    "Implementation",
    "OperatorExecutor",
    "Region",
    "RegionNotSupported",
    "Rejection",
    "flatten_to_prims",
    "metadata_key",
    "resolve_symbol",
]

Checker = Callable[..., "bool | Rejection"]


def resolve_symbol(target) -> Symbol:
    """A Symbol, a torch-level symbol name ("add"), ``"prims.add"``, or a torch callable."""
    from thunder_core.ops import prims
    from thunder_core.ops.registry import TORCH_SYMBOLS, lookup

    if isinstance(target, Symbol):
        return target
    if isinstance(target, str):
        if target.startswith("prims."):
            found = prims.PRIMS.get(target.removeprefix("prims."))
        else:
            found = TORCH_SYMBOLS.get(target.removeprefix("torch."))
        if found is None:
            raise KeyError(f"no thunder_core symbol named {target!r}")
        return found
    entry = lookup(target)
    if entry is None:
        raise KeyError(f"{target!r} has no thunder_core symbol")
    return entry[0]


def metadata_key(bsym: BoundSymbol) -> tuple:
    """What a checker's answer may depend on: tensor metadata and the other arguments."""

    def part(x):
        if isinstance(x, TensorProxy):
            return ("tensor", tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad)
        try:
            hash(x)
        except TypeError:
            return ("unhashable", repr(x))
        return x

    return (bsym.symbol, tuple(part(x) for x in leaves((bsym.args, bsym.kwargs))), tuple(bsym.kwargs))


@dataclass
class Implementation:
    fn: Callable
    checker: Checker | None = None
    grad: Callable | None = None


FIXED_SIZES_ONLY = (
    "runs fixed sizes only, and this operation's sizes are symbolic (compiled for changing shapes)"
)


def has_symbolic_sizes(bsym: BoundSymbol) -> bool:
    """Whether an argument or result of ``bsym`` has a symbolic size (or is one)."""
    values = [*bsym.flat_args(), *bsym.flat_outputs()]
    values += [x for x in leaves((bsym.args, bsym.kwargs)) if isinstance(x, SYMBOLIC_TYPES)]
    return any(isinstance(x, SYMBOLIC_TYPES) or has_symbolic_shape(x) for x in values)


class Executor:
    """Base class: a named executor with a claim priority."""

    #: Higher runs first when no explicit order is given.
    default_priority: int = 0
    #: Whether this executor runs operations whose sizes are symbolic (a trace compiled for
    #: changing shapes) for every size: an executor that compiles per size leaves them to others.
    takes_symbolic_sizes: bool = False

    def __init__(self, name: str, *, version: str | None = None):
        self.name = name
        self.version = version
        self._checks: dict[tuple, bool | Rejection] = {}

    def implementation_for(self, symbol: Symbol) -> Implementation | None:
        raise NotImplementedError

    def with_options(self, options: dict) -> Executor:
        """This executor configured with one job's options (declared by ``thunder_core_declare_options``).

        Called once per job; the default returns ``self``. Override it when options change what
        you claim or how you run it, and return a configured executor (a new one, or one cached
        per option values): options then never live on a shared executor::

            def with_options(self, options):
                return build_executor(fp8=options["fp8"])
        """
        return self

    def check(self, bsym: BoundSymbol) -> bool | Rejection:
        """True if this executor takes ``bsym``, else a Rejection with the reason."""
        impl = self.implementation_for(bsym.symbol)
        if impl is None:
            return Rejection(f"no implementation for {bsym.symbol.printed_name}")
        if impl.checker is None:
            return True
        key = metadata_key(bsym)
        try:
            cached = self._checks.get(key)
        except TypeError:
            cached, key = None, None
        if cached is not None:
            return cached
        try:
            verdict = impl.checker(*bsym.args, **bsym.kwargs)
        except Exception as error:  # a broken checker declines, with the reason
            verdict = Rejection(f"checker raised {type(error).__name__}: {error}")
        if verdict is not True:
            verdict = verdict if isinstance(verdict, Rejection) else Rejection("checker declined")
        if key is not None:
            self._checks[key] = verdict
        return verdict

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class OperatorExecutor(Executor):
    """Runs individual symbols with registered implementations."""

    def __init__(self, name: str, *, version: str | None = None):
        super().__init__(name, version=version)
        self.implementations: dict[Symbol, Implementation] = {}

    def register_implementation(
        self, symbol, fn: Callable, *, checker: Checker | None = None, grad: Callable | None = None
    ) -> Symbol:
        """Run ``symbol`` (a Symbol, its name, or a torch callable) with ``fn`` when ``checker`` accepts.

        ``grad``, if given, is a VJP rule (see ``thunder_core.autodiff.register_vjp``) used
        instead of the core's when this executor claims the op in a training trace.
        """
        resolved = resolve_symbol(symbol)
        self.implementations[resolved] = Implementation(fn, checker, grad)
        self._checks.clear()
        return resolved

    def implementation_for(self, symbol: Symbol) -> Implementation | None:
        found = self.implementations.get(symbol)
        if found is None and symbol.plain is not None and not symbol.has_tag(INPLACE):
            found = self.implementations.get(symbol.plain)  # an operation of a no_grad region
        return found

    def claimed(self, bsym: BoundSymbol) -> BoundSymbol:
        impl = self.implementation_for(bsym.symbol)
        name = f"{self.name}_{bsym.symbol.name}"
        return bsym.replace(executor=self.name, impl=impl.fn, impl_name=name)


class FusionExecutor(Executor):
    """Claims symbols, then fuses neighbouring claimed operations into compiled regions."""

    #: Regions with fewer operations than this are given back to the torch executor.
    min_region_size: int = 2
    #: Whether a region's compile may run on a worker thread while its torch operations run
    #: (``thunder_core.executors.background``): compiles of such executors run one at a time,
    #: under ``COMPILE_LOCK``, and ``compile_region`` must not depend on the calling thread.
    compiles_in_background: bool = False
    #: Views of a region's results (transposes, reshapes that need no copy) run after the region,
    #: by torch, instead of inside it: for compilers that return each result with the strides the
    #: trace gives it (Inductor does) and whose calls rebuild a returned view in Python.
    views_after_region: bool = False
    #: Whether a region takes a size symbol as an int input when its tensors give the symbol only
    #: as a multiple of it plus a constant (``s1`` beside a gradient of ``s1 + 2`` columns): for
    #: compilers that read each symbol from a size that is exactly that symbol (Inductor does).
    size_symbols_as_ints: bool = False

    def __init__(self, name: str, *, version: str | None = None):
        super().__init__(name, version=version)
        self.supported: dict[Symbol, Implementation] = {}

    def region_weight(self, region: list[BoundSymbol]) -> int:
        """How much work a region holds, compared with ``min_region_size`` (default: its length)."""
        return len(region)

    def can_join(self, region: list[BoundSymbol], bsym: BoundSymbol) -> bool:
        """Whether ``bsym`` may extend ``region``; False starts a new region at ``bsym``."""
        return True

    def register_supported(
        self, symbol, *, checker: Checker | None = None, grad: Callable | None = None
    ) -> Symbol:
        """Claim ``symbol`` when ``checker`` accepts; ``grad`` as in ``register_implementation``."""
        resolved = resolve_symbol(symbol)
        self.supported[resolved] = Implementation(fn=resolved.impl, checker=checker, grad=grad)
        self._checks.clear()
        return resolved

    def implementation_for(self, symbol: Symbol) -> Implementation | None:
        return self.supported.get(symbol)

    def compile_region(self, region: Region) -> Callable:
        """Compile one region into a callable taking ``region.inputs`` and returning ``region.outputs``."""
        raise NotImplementedError

    def prepare_compiles(self) -> None:
        """Import what ``compile_region`` needs. Called on the calling thread before a region's
        compile goes to the background worker, so that a compiler imported lazily (at its first
        region) is never imported on the worker while the program runs; nothing by default."""

    def model_compile_starting(self) -> None:
        """A model's program (a module with parameters) is about to be captured for a job with
        this executor: start one-time set-up that takes long and does not depend on the regions
        (a check of the compiler), so that it runs while the program is captured and transformed.
        Nothing by default. Programs of plain functions (``jit(lambda a, b: a + b)``) do not call
        it: a job whose program has no region of this executor need import nothing of its library."""

    def materializes(self, bsym: BoundSymbol) -> bool:
        """Whether a compiled region writes this operation's inputs and outputs to memory (a call
        into a library kernel such as a matmul) instead of keeping them in registers; False by
        default. Measured selection counts those, with the region's outputs, toward what a region
        holds at once, and never measures an alternative that would raise the trace's peak."""
        return False

    def finer_variant(self) -> tuple[str, FusionExecutor] | None:
        """The same compiler claiming smaller regions, with a label for ``explain``; None by default.

        An executor that claims large regions (whole stretches of the program, matmuls
        included) returns the variant claiming only what it fuses, so that measured selection
        times each large region against the finer claims plus the rest of the job on the same
        operations (unless those would raise the trace's peak memory). The variant
        shares this executor's name and options; its own ``finer_variant()`` must return None.
        """
        return None

    def fusion_pass(self, trace: Trace, options: dict | None = None) -> Trace:
        """Replace each maximal run of this executor's claimed bound symbols by one fused call.

        ``options`` are this executor's per-job options; ``min_region_size`` among them
        overrides the class default.
        """
        return fuse_regions(trace, self, (options or {}).get("min_region_size", self.min_region_size))
