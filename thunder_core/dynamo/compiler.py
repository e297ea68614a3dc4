"""The ``thunder_core`` backend of ``torch.compile``: Dynamo's FX graphs through thunder_core.

Dynamo captures the Python program into FX graphs, breaking the graph wherever it cannot trace
(``.item()`` in a branch, ``print``, unsupported libraries) and guarding every Python value it
read. Each graph it hands over is split (``split.py``) into the parts thunder_core captures — each
compiled by ``thunder_core.jit`` with the job's executors and plugins, and connected to PyTorch
autograd like ``jit`` — and the rest, compiled by Inductor (or run eagerly). Everything compiled
for one ``torch.compile``-d callable is kept in a ``CompileReport`` for ``explain`` and
``last_traces``.
"""

from __future__ import annotations

import copy
import operator
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.passes.split_module
from torch import fx

from thunder_core.dynamo.split import GRAD_MODE_SWITCHES, Partition, is_inplace_view, partition
from thunder_core.errors import CaptureError, DataDependentError
from thunder_core.ir.symbolic import solve_linear
from thunder_core.jit.dynamic import ArgumentDims
from thunder_core.jit.module import ThunderModule
from thunder_core.ops.registry import draws_random_numbers
from thunder_core.plugins.config import resolve
from thunder_core.plugins.errors import ConfigError
from thunder_core.plugins.job import build_job

# Dynamo by default does not guard on module hooks added after compilation (a hook registered
# later is silently ignored); thunder_core's contract is never a stale result, so once this
# backend is loaded, hook changes recompile — for every torch.compile in the process.
if hasattr(torch._dynamo.config, "skip_nnmodule_hook_guards"):
    torch._dynamo.config.skip_nnmodule_hook_guards = False

OPTIONS = {
    "executors": "ordered executor names (as in thunder_core.jit)",
    "plugins": "transform plugins to enable",
    "options": "per executor/plugin options, {name: {option: value}}",
    "disable": "executors or plugins never to use",
    "select": "'measure' (default) or 'priority', as in thunder_core.jit",
    "fallback": "'inductor' (default) or 'eager': what runs the parts thunder_core does not capture",
    "recompile_limit": "compilations per thunder_core part before it runs eagerly (default 8)",
    "compile_in_background": "'never' (default), 'recompiles' or 'always', as in thunder_core.jit",
}


@dataclass
class GraphRecord:
    """One FX graph Dynamo handed over: where it ended, and how it was split."""

    index: int
    code: str  # the function (or Dynamo resume function) the graph came from
    ended_by: str  # Dynamo's reason: a graph break, or the end of the function
    graph_break: bool
    location: str  # file:line of the user code where the graph ended
    partitions: list[Partition]
    compiled: dict[str, Any] = field(default_factory=dict)  # partition name -> ThunderModule or fallback
    notes: list[str] = field(default_factory=list)


class CompileReport:
    """Every graph, graph break and split of one ``torch.compile``-d callable."""

    def __init__(self):
        self.graphs: list[GraphRecord] = []
        self.lock = threading.Lock()

    def thunder_parts(self) -> list[tuple[GraphRecord, str, ThunderModule]]:
        return [
            (record, name, part)
            for record in self.graphs
            for name, part in record.compiled.items()
            if isinstance(part, ThunderModule)
        ]


_REPORTS: dict[int, tuple[Any, CompileReport]] = {}


def _owner_of_compile():
    """The callable ``torch.compile`` wrapped, found on the stack (Dynamo calls backends from it)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "compile_wrapper" and frame.f_code.co_filename.endswith("eval_frame.py"):
            fn = frame.f_locals.get("fn")
            wrapped = getattr(fn, "__wrapped__", None)  # a torch.nn module's call, wrapped by Dynamo
            by_dynamo = getattr(getattr(fn, "__code__", None), "co_filename", "").endswith(
                "external_utils.py"
            )
            return wrapped if by_dynamo and isinstance(wrapped, torch.nn.Module) else fn
        frame = frame.f_back
    return None


def _key(fn):
    self = getattr(fn, "__self__", None)
    return id(self) if self is not None else id(fn)


def _referent(fn):
    return getattr(fn, "__self__", None) or fn


def report_for(compiled) -> CompileReport | None:
    """The report of a ``torch.compile``-d function or module, if thunder_core compiled any of it."""
    original = getattr(compiled, "_torchdynamo_orig_callable", None)
    if original is None:
        return None
    entry = _REPORTS.get(_key(original))
    if entry is None:
        return None
    ref, report = entry
    alive = ref() if isinstance(ref, weakref.ref) else ref
    return report if alive is _referent(original) else None


def _report_for_owner(owner) -> CompileReport:
    key = _key(owner)
    entry = _REPORTS.get(key)
    referent = _referent(owner)
    if entry is not None:
        ref, report = entry
        if (ref() if isinstance(ref, weakref.ref) else ref) is referent:
            return report
    report = CompileReport()
    try:
        ref = weakref.ref(referent, lambda _, key=key: _REPORTS.pop(key, None))
    except TypeError:
        ref = referent
    _REPORTS[key] = (ref, report)
    return report


def _dynamo_context():
    """(code name, reason the graph ended, was it a graph break, user location), from Dynamo."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        reason = tx.output.compile_subgraph_reason
    except Exception:  # a torch without these internals: report less, compile the same
        return "?", "(unknown)", False, "?"
    stack = list(getattr(reason, "user_stack", None) or [])
    location = f"{stack[-1].filename}:{stack[-1].lineno}: {(stack[-1].line or '').strip()}" if stack else "?"
    text = " ".join(str(getattr(reason, "reason", "")).split())
    return tx.f_code.co_name, text, bool(getattr(reason, "graph_break", False)), location


class _Fallback:
    """A part thunder_core does not capture: compiled by Inductor, else run eagerly.

    Inductor compiles it while Dynamo hands the graph over, on Dynamo's example inputs (fake
    tensors whose sizes may be symbolic), as ``backend="inductor"`` would: the code it makes
    serves every size Dynamo's guards let through. Compiling it on the first call's real
    inputs instead would fix their sizes, and a later call with other sizes would get sizes
    and numbers computed for the first.
    """

    def __init__(
        self, gm: fx.GraphModule, how: str, record: GraphRecord, name: str, metadata_changes: bool = False
    ):
        self.gm, self.how, self.record, self.name = gm, how, record, name
        self.compiled, self.runner = gm, "eager"
        if how == "inductor" and _switches_grad_mode(gm):
            # Inductor's code would compute in the mode it was traced in and switch nothing.
            self.runner = "eager (it switches grad mode for the parts after it)"
        elif how == "inductor" and _draws_random_numbers(gm):
            # Inductor draws with its own generator (other numbers, another stream position).
            self.runner = "eager (it draws random numbers; Inductor's draws differ from eager's)"
        elif how == "inductor" and metadata_changes:
            # Dynamo's example value of such a tensor shows its sizes after the change, in every
            # part: compiled for them, the change was lost (``y.t_()`` left y as it was) or a part
            # that reads the tensor before it failed Inductor's size checks.
            self.runner = "eager (Dynamo's graph changes a tensor's sizes or strides in place)"
        elif how == "inductor":
            examples = _example_inputs(gm)
            if examples is None:
                self.runner = "eager (Dynamo gave no example inputs for this part)"
                return
            try:
                from torch._inductor.compile_fx import compile_fx

                # Inductor may rewrite the graph it is given: give it a copy, keep ours for eager.
                graph_copy = fx.GraphModule(gm, copy.deepcopy(gm.graph))
                self.compiled, self.runner = compile_fx(graph_copy, examples), "inductor"
            except Exception as error:  # Inductor cannot compile it: eager is always right
                self.runner = f"eager (Inductor failed: {type(error).__name__}: {str(error)[:200]})"

    def __call__(self, *args):
        return self.compiled(*args)


def _switches_grad_mode(gm: fx.GraphModule) -> bool:
    return any(node.op == "call_function" and node.target in GRAD_MODE_SWITCHES for node in gm.graph.nodes)


def _changes_metadata_in_place(gm: fx.GraphModule) -> bool:
    """Whether the graph changes a tensor's sizes or strides in place (``y.t_()``,
    ``torch.ops.aten.t_``): an ATen operation PyTorch tags ``inplace_view``."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and torch.Tag.inplace_view in getattr(node.target, "tags", ()):
            return True
        if node.op in ("call_method", "call_function"):
            name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
            if isinstance(name, str) and is_inplace_view(name.split(".")[0]):
                return True
    return False


def _example_inputs(gm: fx.GraphModule) -> list | None:
    """Dynamo's example values (fake tensors, SymInts) of ``gm``'s inputs, or None if one lacks them."""
    examples = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value", node.meta.get("val"))
        if value is None:
            return None
        examples.append(value)
    return examples


def _draws_random_numbers(gm: fx.GraphModule) -> bool:
    return any(
        node.op in ("call_function", "call_method") and draws_random_numbers(node.target)
        for node in gm.graph.nodes
    )


@dataclass
class _SizeReading:
    """How a part computes one of Dynamo's size inputs from its tensor inputs: each symbol is
    ``(args[tensor].shape[dim] - offset) // scale``, then ``expression`` of the symbols (None:
    the size is the one symbol)."""

    symbols: list[tuple[int, int, int, int]]  # (tensor input position, dim, scale, offset)
    expression: Any = None  # the expression's function of the symbols' values

    def value(self, args) -> int:
        values = [(args[t].shape[d] - offset) // scale for t, d, scale, offset in self.symbols]
        return values[0] if self.expression is None else self.expression(*values)


def _sizes_read_from_tensors(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict[int, _SizeReading]]:
    """``gm`` with each size input that is a dimension of one of its tensor inputs read from
    that tensor instead (``x.size(1)``; ``x.size(1) - 1`` when the dimension is the size plus
    one, ``x.size(0) // 2`` when it is twice the size; an expression of such sizes computed
    from them), and how each dropped input is computed from the others, by position.

    Dynamo passes a symbolic size its graph uses as an int input of its own, beside the tensor it
    came from. Given as an int, thunder_core would key its cache on the int's value and compile
    a part again for every new size; read from the tensor, the size is one of the tensor's
    dimensions, which thunder_core's automatic dynamic shapes make symbolic after the first
    change. Which dimension is taken from Dynamo's example values; an example value that an
    in-place view changed later in Dynamo's graph (``y.t_()``) shows the dimensions after the
    change, so ``_ThunderPart`` compares every dropped input with the value read before using
    the reading. A copy of the graph is changed (sharing ``gm``'s parameters); ``gm`` itself
    stays as Dynamo gave it.
    """
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    values = [node.meta.get("example_value", node.meta.get("val")) for node in placeholders]
    dimension_of: dict = {}  # size symbol -> (tensor input position, dim, scale, offset)
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                solved = solve_linear(size.node.expr) if isinstance(size, torch.SymInt) else None
                if solved is not None:
                    dimension_of.setdefault(solved[0], (position, dim, *solved[1:]))
    dropped = [
        position
        for position, value in enumerate(values)
        if isinstance(value, torch.SymInt)
        and value.node.expr.free_symbols
        and value.node.expr.free_symbols <= dimension_of.keys()
    ]
    if not dropped:
        return gm, {}
    sized = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # shares gm's parameters and buffers
    graph = sized.graph
    nodes = list(graph.find_nodes(op="placeholder"))
    sizes: dict = {}  # size symbol -> the graph node reading it from its tensor
    added: list[fx.Node] = []
    readings: dict[int, _SizeReading] = {}
    last = nodes[-1]  # new nodes go after the placeholders, in the order they are made

    def add(make, *args) -> fx.Node:
        nonlocal last
        with graph.inserting_after(last):
            last = make(*args)
        added.append(last)
        return last

    for position in dropped:
        expr = values[position].node.expr
        symbols = sorted(expr.free_symbols, key=str)
        for symbol in symbols:
            if symbol not in sizes:
                tensor, dim, scale, offset = dimension_of[symbol]
                sizes[symbol] = add(graph.call_method, "size", (nodes[tensor], dim))
                if offset:  # the dim is the symbol plus a constant (a mask one longer than the cache)
                    sizes[symbol] = add(graph.call_function, operator.sub, (sizes[symbol], offset))
                if scale != 1:  # a multiple of the symbol (a flattened batch)
                    sizes[symbol] = add(graph.call_function, operator.floordiv, (sizes[symbol], scale))
        reading = _SizeReading([dimension_of[symbol] for symbol in symbols])
        if expr.is_Symbol:
            value = sizes[expr]
        else:  # a size an earlier part of Dynamo's graph computed from sizes (``s0 + 1``)
            name = f"thunder_core_size_{position}"
            module = _SizeExpression(expr, symbols)
            sized.add_submodule(name, module)
            reading.expression = module.compute
            value = add(graph.call_module, name, tuple(sizes[s] for s in symbols))
        value.meta = dict(nodes[position].meta)
        nodes[position].replace_all_uses_with(value)
        graph.erase_node(nodes[position])
        readings[position] = reading
    for node in reversed(added):  # reads of sizes nothing used
        if not node.users:
            graph.erase_node(node)
    sized.recompile()
    return sized, readings


def _numbers_read_from_inputs(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[int]]:
    """``gm`` taking a Python number where Dynamo passes a 0-d tensor that its graph only reads with
    ``.item()``, and the positions of those inputs.

    With dynamic shapes Dynamo passes a float attribute of a module (an epsilon, a scaling
    factor) as a 0-d tensor and reads it with ``.item()`` in the graph; ``.item()`` has no
    thunder_core symbol, and splitting the graph at every such read would cut a model into a
    part per layer. The caller reads the number (``_ReadingNumbers``) and the part takes it as
    a Python number, part of its cache key: a value that changes from call to call compiles
    the part again (up to its recompile limit). Only inputs Dynamo itself wrapped as tensors
    (``GraphArg.pass_arg_as_tensor``) are read so. A copy of the graph is changed.
    """
    positions = []
    for position, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get("example_value", node.meta.get("val"))
        users = list(node.users)
        wrapped = getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False)  # Dynamo's, not the user's
        if (
            wrapped
            and isinstance(value, torch.Tensor)
            and value.dim() == 0
            and users
            and all(u.op == "call_method" and u.target == "item" and len(u.args) == 1 for u in users)
        ):
            positions.append(position)
    if not positions:
        return gm, []
    read = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # shares gm's parameters and buffers
    placeholders = list(read.graph.find_nodes(op="placeholder"))
    for position in positions:
        node = placeholders[position]
        number = next(iter(node.users)).meta.get("example_value")
        node.meta = {"example_value": number} if number is not None else {}
        for item in list(node.users):
            item.replace_all_uses_with(node)
            read.graph.erase_node(item)
    read.recompile()
    return read, positions


class _ReadingNumbers:
    """Calls ``compiled`` with the inputs at ``positions`` (0-d tensors) read as Python numbers."""

    def __init__(self, compiled, positions: list[int]):
        self.compiled, self.positions = compiled, sorted(positions)

    def __call__(self, *args):
        args = list(args)
        for i in self.positions:
            args[i] = args[i].item()
        return self.compiled(*args)


class _SizeExpression(torch.nn.Module):
    """Computes a sympy size expression (``s0 + 1``) from the values of its symbols."""

    def __init__(self, expr, symbols: list):
        import sympy
        from torch.utils._sympy.printers import PythonPrinter

        from thunder_core.capture.symbolic import guard_globals

        super().__init__()
        names = [f"size_{i}" for i in range(len(symbols))]
        renamed = {s: sympy.Symbol(name, integer=True) for s, name in zip(symbols, names)}
        self.source = PythonPrinter().doprint(expr.xreplace(renamed))
        self.compute = eval(f"lambda {', '.join(names)}: {self.source}", guard_globals())  # noqa: S307

    def forward(self, *sizes):
        return self.compute(*sizes)


class _ThunderPart:
    """Runs a part with thunder_core; if capturing it fails (a value Dynamo left as a tensor read as
    a Python number, say), that part runs eagerly from then on and the report says why.

    ``readings``: Dynamo's size inputs that the thunder_core part reads from its tensors instead
    (``_sizes_read_from_tensors``), left out of its arguments. Each call checks that they equal
    what the part reads; if one ever does not, the part is compiled again from Dynamo's graph as
    it is (``unsized()``, sizes as ints) and runs that way from then on. ``numbers``: the
    positions of 0-d tensors read as Python numbers first (``_numbers_read_from_inputs``), when
    the part is Dynamo's whole graph.

    Called on every run of the compiled graph, so it goes straight to the part's jitted function
    (``ThunderModule._forward``) unless hooks were registered on the part itself.
    """

    def __init__(
        self, part: ThunderModule, gm: fx.GraphModule, record: GraphRecord, name: str, readings, unsized
    ):
        self.part, self.gm, self.record, self.name = part, gm, record, name
        self.eager = False  # capturing it failed: Dynamo's graph runs as it is
        self.readings: dict[int, _SizeReading] = readings
        self.numbers: list[int] = []
        self._unsized = unsized
        inputs = len(gm.graph.find_nodes(op="placeholder"))
        self._kept = [i for i in range(inputs) if i not in readings]  # the arguments passed on

    def _sizes_agree(self, args) -> bool:
        try:
            return all(args[p] == reading.value(args) for p, reading in self.readings.items())
        except Exception:  # noqa: BLE001 - a reading that cannot be taken does not agree
            return False

    def __call__(self, *args):
        if self.numbers:
            args = list(args)
            for i in self.numbers:
                args[i] = args[i].item()
        if self.eager:
            return self.gm(*args)
        part, given = self.part, args
        try:
            if self.readings:
                if self._sizes_agree(args):
                    given = [args[i] for i in self._kept]
                else:
                    self.record.notes.append(
                        f"{self.name}: a size Dynamo passed differs from the tensor dimension it was read "
                        "from (a view changed in place later in the graph?); the part takes the sizes as "
                        "ints from now on"
                    )
                    self.readings, part = {}, self._unsized()
                    self.part = self.record.compiled[self.name] = part
            if not part.calls_directly():
                return part(*given)  # hooks registered on the part: nn.Module's call runs them
            return part._forward(*given)
        except (CaptureError, DataDependentError) as error:
            first = str(error).splitlines()[0][:240]
            self.record.notes.append(
                f"{self.name}: thunder_core could not capture it ({type(error).__name__}: {first}); it runs eagerly"
            )
            self.eager = True
            return self.gm(*args)


class ThunderCompiler:
    """A Dynamo backend: ``torch.compile(model, backend=ThunderCompiler(executors=[...]))``.

    ``backend="thunder_core"`` (registered by entry point) makes one from
    ``torch.compile(..., options={...})``; the options are ``OPTIONS``, with the same names as
    ``thunder_core.jit``'s, and the environment and config file apply as for ``jit``.
    """

    def __init__(self, **options):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            known = "; ".join(f"{k}: {v}" for k, v in OPTIONS.items())
            raise ConfigError(
                f"unknown torch.compile option(s) {unknown} for backend 'thunder_core'; known: {known}"
            )
        self.fallback = options.get("fallback", "inductor")
        if self.fallback not in ("inductor", "eager"):
            raise ConfigError(
                f"backend 'thunder_core': fallback must be 'inductor' or 'eager', got {self.fallback!r}"
            )
        self.recompile_limit = options.get("recompile_limit", 8)
        config = resolve(
            executors=options.get("executors"),
            plugins=options.get("plugins"),
            options=options.get("options"),
            disable=options.get("disable"),
            select=options.get("select"),
            compile_in_background=options.get("compile_in_background"),
        )
        self.job = build_job(config)
        if self.job.module_transforms:
            names = sorted({name.split(".")[0] for _, _, name in self.job.module_transforms})
            raise ConfigError(
                f"backend 'thunder_core': the plugin(s) {names} change the module itself (its parameters), "
                "which Dynamo hands over as separate graphs; use thunder_core.jit(model, plugins=...) instead, "
                "or PyTorch's own wrappers around the model (DistributedDataParallel, fully_shard) with this backend"
            )

    def __call__(self, gm: fx.GraphModule, example_inputs, **kwargs):
        gm, numbers = _numbers_read_from_inputs(gm)
        compiled = self._compile_graph(gm, example_inputs)
        if numbers and isinstance(compiled, _ThunderPart):
            compiled.numbers = sorted(numbers)  # read by the part itself: one call less per run
        elif numbers:
            compiled = _ReadingNumbers(compiled, numbers)
        return compiled

    def _compile_graph(self, gm: fx.GraphModule, example_inputs):
        owner = _owner_of_compile()
        report = _report_for_owner(owner) if owner is not None else CompileReport()
        code, ended_by, graph_break, location = _dynamo_context()
        assignment, partitions = partition(gm)
        with report.lock:
            # Dynamo compiling the same stretch of a frame again (new sizes, a failed guard): its
            # parts' first programs are recompiles (compile_in_background="recompiles").
            again = any((g.code, g.location) == (code, location) for g in report.graphs)
            record = GraphRecord(len(report.graphs), code, ended_by, graph_break, location, partitions)
            report.graphs.append(record)
        if any(isinstance(x, torch.SymInt) or _symbolic(x) for x in example_inputs):
            record.notes.append(
                "dynamic shapes: Dynamo passed symbolic sizes; each thunder_core part reads them from its "
                "tensors and makes the dimensions that change symbolic (one more compile, then every size)"
            )
        if len(partitions) == 1 and partitions[0].owner == "thunder_core":
            runner = self._thunder_part(gm, record, partitions[0].name, again)
            record.compiled[partitions[0].name] = runner.part
            return runner
        split = torch.fx.passes.split_module.split_module(
            gm, None, lambda node: assignment[node], keep_original_order=True
        )  # in graph order: a part that mutates an input runs before the parts after it
        metadata_changes = _changes_metadata_in_place(gm)
        for index, part in enumerate(partitions):
            name = f"submod_{index}"
            submodule = getattr(split, name)
            if part.owner == "thunder_core":
                runner = self._thunder_part(submodule, record, name, again)
                compiled = runner.part
            else:
                compiled = runner = _Fallback(submodule, self.fallback, record, name, metadata_changes)
            record.compiled[name] = compiled
            setattr(split, name, _AsModule(runner))
        return split

    def _thunder_part(self, gm: fx.GraphModule, record: GraphRecord, name: str, again: bool) -> _ThunderPart:
        sized, readings = _sizes_read_from_tensors(gm)
        # Taken as ints when a size read from a tensor disagrees with Dynamo's: its example values
        # are not to be trusted there, nor the symbolic dims read from them.
        unsized = lambda: self._module(gm, None, again)  # noqa: E731
        part = self._module(sized, _symbolic_dims(sized), again)
        return _ThunderPart(part, gm, record, name, readings, unsized)

    def _module(self, gm: fx.GraphModule, dynamic: ArgumentDims | None, again: bool) -> ThunderModule:
        # Dynamo guards the Python state; the FX graph itself holds none, so no guards of our own.
        return ThunderModule(
            gm,
            recompile_limit=self.recompile_limit,
            job=self.job,
            cache="same input",
            dynamic=dynamic,
            recompiles=again,
        )


def _symbolic_dims(gm: fx.GraphModule) -> ArgumentDims | None:
    """The dimensions of ``gm``'s tensor inputs, and its int inputs, that Dynamo made symbolic, by
    input position: the part's first compile makes them symbolic too, so a size Dynamo lets
    through compiles nothing more (None when Dynamo fixed every size: the part's own automatic
    dynamic shapes apply)."""
    dims, ints = ArgumentDims(), set()
    for position, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor):
            symbolic = frozenset(d for d, size in enumerate(value.shape) if isinstance(size, torch.SymInt))
            if symbolic:
                dims[position] = symbolic
        elif isinstance(value, torch.SymInt) and value.node.expr.free_symbols:
            ints.add(position)
    dims.ints = frozenset(ints)
    return dims if dims or ints else None


class _AsModule(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _symbolic(x) -> bool:
    if not isinstance(x, torch.Tensor):
        return False
    return any(isinstance(s, torch.SymInt) for s in x.shape)


def backend(gm: fx.GraphModule, example_inputs, options: dict | None = None, **unused):
    """The ``torch_dynamo_backends`` entry point: ``torch.compile(fn, backend="thunder_core")``."""
    if unused:
        warnings.warn(
            f"backend 'thunder_core' ignores {sorted(unused)}; pass options={{...}} instead", stacklevel=2
        )
    return ThunderCompiler(**(options or {}))(gm, example_inputs)
