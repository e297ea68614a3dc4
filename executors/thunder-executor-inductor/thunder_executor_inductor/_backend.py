"""What the Inductor executor runs to compile a region: imported at its first region's compile.

``torch._inductor`` (and with it ``torch._dynamo``) takes over a second to import, so a job whose
programs never reach a region (a single op, or only the torch executor's work) does not pay it.
What only compiling needs (``compile_fx``, the tracer) is imported by ``import_compiler``, so
that a process loading regions an earlier one compiled (``_reuse``) imports only what their
generated code imports.
"""

from __future__ import annotations

import logging
import re
import threading
import types
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext

import torch
import torch._inductor
from torch._guards import TracingContext, tracing
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.codecache import CodeCacheFuture, PyCodeCache

from thunder_core.extend import (
    COMPILE_LOCK,
    RegionNotSupported,
    SymbolicSizeError,
    TensorProxy,
    on_compile_worker,
    region_fingerprint,
    symbolic_examples,
)
from thunder_executor_inductor import _reuse, _vec_isa


def import_compiler() -> None:
    """Import what compiling a region runs (Inductor's graph compiler, the tracer), once, on the
    calling thread."""
    import torch._inductor.compile_fx  # noqa: F401 - what standalone_compile runs too
    from torch._inductor.decomposition import select_decomp_table  # noqa: F401


def warm_up() -> None:
    """Inductor's one-time set-up, before the process's first compile (later calls return at once):
    waits for the vector ISA probe (``_vec_isa``) that the executor started before importing this."""
    _vec_isa.wait()


_KERNEL_FUTURES = (Future, CodeCacheFuture)
_deferring = threading.local()  # .modules: a list while a compile leaves its kernel builds running
_finishing = threading.Lock()


def _install_deferred_wait() -> None:
    """Let a generated module's ``async_compile.wait(globals())`` leave its kernels building.

    Inductor hands each kernel of a graph to its compile pool (C++ compilers, Triton) and the
    generated module waits for all of them as it loads, inside ``compile_fx_inner``. A region
    compiled for a program that is still being compiled need not wait there: the wait is moved
    to the region's first call (``_finish``), so the compiler processes of one region run while
    the next regions are lowered and traced. Only on the thread that asked for it
    (``_kernels_built_later``); every other module loads as Inductor loads it.
    """
    original = AsyncCompile.wait
    if getattr(original, "thunder_core_defers", False):
        return

    def wait(self, scope):
        modules = getattr(_deferring, "modules", None)
        if modules is None or getattr(self, "_metal_sources", None):
            return original(self, scope)
        if any(isinstance(value, _KERNEL_FUTURES) for value in scope.values()):
            modules.append(scope)
        return original(self, {})  # Inductor's end-of-compile bookkeeping, nothing to wait for

    wait.thunder_core_defers = True
    AsyncCompile.wait = wait


@contextmanager
def _kernels_built_later(modules: list, examples: list):
    """Compiles in this block leave their kernel builds running; ``modules`` collects the
    generated modules' globals, to be finished by ``_finish`` before their code runs.

    Only for C++ kernels of regions on the CPU (``_built_now`` finishes any other graph at
    once: a CUDA region's first call may come inside a CUDA graph capture, where loading its
    kernels is not allowed); not on the compile worker (nothing waits there, and its region is
    swapped in as soon as its compile returns); not with autotuning, at compile time or of
    GEMM templates (Inductor runs what it loads during the compile). A graph that updates a
    tensor in place is compiled outside this block: its first run must not fail after part of
    its effect.
    """
    config = torch._inductor.config
    on_cpu = all(x.device.type == "cpu" for x in examples if isinstance(x, torch.Tensor))
    defer = (
        on_cpu
        and not on_compile_worker()
        and getattr(config, "cpu_backend", "cpp") == "cpp"
        and not config.max_autotune
        and not getattr(config.triton, "autotune_at_compile_time", False)
    )
    if not defer:
        yield
        return
    _install_deferred_wait()
    previous, _deferring.modules = getattr(_deferring, "modules", None), modules
    try:
        yield
    finally:
        _deferring.modules = previous


def _built_now(compiled, modules: list) -> None:
    """Finish at once the builds of a graph that computes anywhere but on the CPU."""
    if modules and not set(getattr(compiled, "device_types", None) or ("unknown",)) <= {"cpu"}:
        _finish(modules)


def _finish(modules: list) -> None:
    """Wait for the kernels that ``_kernels_built_later`` left building and bind them in their
    modules. A kernel that failed to build raises here, at the region's first call, where
    thunder-core falls back to torch for the region as for any failed first run."""
    timeout = torch._inductor.config.compile_worker_wait_timeout or None
    with _finishing:
        for scope in modules:
            for key, value in list(scope.items()):
                if isinstance(value, _KERNEL_FUTURES):
                    scope[key] = value.result(timeout=timeout)
        modules.clear()


def _settings(options: dict, trace) -> dict:
    """Inductor's settings for a region: the job's, and for a region that computes in float16 or
    bfloat16 its intermediates rounded as eager's separate kernels round them
    (``emulate_precision_casts``: a fused chain computed in float32 and rounded once differs from
    eager by several units in the last place) unless the job chose otherwise
    (``eager_rounding=False``). Other regions are left alone (on CUDA the setting also turns off
    fused multiply-adds in float32 kernels). Settings this torch lacks are left out."""
    low = (torch.float16, torch.bfloat16)
    tensors = [*trace.inputs, *(p for b in trace.bound_symbols for p in b.flat_outputs())]
    if any(isinstance(p, TensorProxy) and p.dtype in low for p in tensors):
        options = {"emulate_precision_casts": True, **options}
    return {name: value for name, value in options.items() if hasattr(torch._inductor.config, name)}


def compile_region(region, name: str, options: dict):
    """One region as an Inductor-compiled callable taking the region's inputs.

    Compiled code asserts its inputs' strides. The trace's metadata predicts them, but a value
    made by another executor may arrive with other strides (an expanded gradient that came out
    contiguous, say); such calls get a variant compiled for the strides they bring. A region
    that an earlier process compiled loads its generated code directly (``_reuse``).
    """
    try:
        trace = region.as_trace(name)
        options = _settings(options, trace)
        fn = _with_trace_layouts(trace.python_callable(), region.outputs)
    except SymbolicSizeError as error:
        raise RegionNotSupported(f"inductor: {error}") from error
    examples = symbolic_examples(region.inputs)
    if examples is not None:  # tensors, and ints the program takes symbolic (SymInt inputs of the graph)
        return _compile_symbolic(fn, examples, options)
    if not all(isinstance(p, TensorProxy) for p in region.inputs):
        raise RegionNotSupported("inductor: a region input is not a tensor")
    specs = [(tuple(p.shape), p.dtype, p.device) for p in region.inputs]
    fingerprint = region_fingerprint(region) if _reuse.kept() else None

    def compile_for(strides: tuple):
        examples = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for (shape, dtype, device), stride in zip(specs, strides)
        ]
        return _compile_static(fn, examples, options, fingerprint)

    expected = tuple(tuple(p.stride()) for p in region.inputs)
    compiled = compile_for(expected)
    variants = {expected: compiled}
    traced = list(expected)
    direct, building = getattr(compiled, "direct", None), getattr(compiled, "building", None)

    def run(*args):
        # The common call, in one frame: the traced strides, straight into the generated code.
        if direct is not None and [a.stride() for a in args] == traced:
            if building:
                _finish(building)
            return direct(list(args))
        strides = tuple(a.stride() for a in args)
        if strides == expected:
            return tuple(compiled(*args))
        variant = variants.get(strides)
        if variant is None:
            try:
                with COMPILE_LOCK:  # one Inductor compile at a time, with those in the background
                    variant = compile_for(strides)
            except RegionNotSupported:  # nothing to compute for these strides: run the ops as they are
                variant = fn
            variants[strides] = variant
        return tuple(variant(*args))

    run.source_code = getattr(compiled, "source_code", None)  # the generated code, for inspection
    return run


def _with_trace_layouts(fn, outputs):
    """``fn``, its outputs laid out in memory as the trace records them (eager's strides).

    Inductor keeps the strides its decompositions give a graph's outputs, which need not be
    eager's: ``torch.cat`` of an empty tensor and a transposed one is contiguous in eager, and
    the transposed input's layout after decomposition. A program stores such a value (a cache
    tensor) and reads it back on its next call, where its guards and its later regions expect
    the recorded strides; so an output whose traced layout differs is forced to the recorded
    one (Inductor writes it that way in the kernel that computes it, not as an extra copy).
    """
    wanted = [tuple(p.stride()) if isinstance(p, TensorProxy) and _dense(p) else None for p in outputs]

    def laid_out(*args):
        results = fn(*args)
        inputs = _storages(args)
        return tuple(
            r if s is None or not _may_differ(r, s) or _storages([r]) & inputs else _force_layout(r, s)
            for r, s in zip(results, wanted)
        )  # a result that is an input's memory (``keys.detach()``) stays it: forcing would copy it

    return laid_out


def _storages(values) -> set:
    """The storages of the tensors among ``values`` (fake or real), as comparable references."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return {StorageWeakRef(v.untyped_storage()) for v in values if isinstance(v, torch.Tensor)}


def _force_layout(result: torch.Tensor, strides: tuple) -> torch.Tensor:
    """``result`` computed into the dense layout whose dims are ordered as ``strides`` order them.
    The strides are built from ``result``'s own sizes, so that tracing records them in terms of
    the graph's size symbols."""
    order = sorted(range(result.dim()), key=lambda d: (_hints(strides)[d], -d))  # innermost first
    dense, step = [0] * result.dim(), 1
    for d in order:
        dense[d] = step
        step = step * result.shape[d]
    return torch.ops.prims.inductor_force_stride_order(result, dense)


def _may_differ(result, strides: tuple) -> bool:
    """Whether Inductor may lay out ``result`` otherwise than ``strides``: when they differ for the
    traced sizes, and always when sizes are symbolic (equal strides for the traced sizes need not
    be equal for others; forcing an order that already holds adds nothing to the kernel)."""
    if not isinstance(result, torch.Tensor):
        return False
    return any(isinstance(s, torch.SymInt) for s in strides) or _hints(result.stride()) != _hints(strides)


def _hints(values) -> tuple[int, ...]:
    """Sizes or strides as numbers: a symbolic one by its value for the traced example, so
    comparing them adds no guard."""
    return tuple(v.node.hint if isinstance(v, torch.SymInt) else v for v in values)


def _dense(proxy) -> bool:
    """Whether a tensor's recorded strides lay it out without gaps or overlaps (as a freshly
    computed value is); an expanded or sliced layout is left as Inductor makes it."""
    pairs = sorted(
        ((st, si) for si, st in zip(_hints(proxy.shape), _hints(proxy.stride())) if si != 1), reverse=True
    )
    expected = 1
    for stride, size in reversed(pairs):
        if stride != expected:
            return False
        expected *= size
    return True


def _computes_something(graph) -> None:
    if not any(node.op == "call_function" for node in graph.graph.nodes):
        raise RegionNotSupported("inductor: the region computes nothing (its ops are no-ops here)")


def _mutates(graph) -> bool:
    """Whether a traced region updates a tensor in place (a decomposition may write into a buffer
    it made); such graphs are functionalized before Inductor."""
    for node in graph.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _functionalized(fn, examples: list) -> torch.fx.GraphModule:
    """``fn`` traced with Inductor's decompositions as a functional graph that ends by copying
    each updated input's new value into it (``copy_``): what AOTAutograd hands Inductor for an
    inference graph that writes its inputs, and what Inductor compiles into writes of the input
    buffers (a cache's ``index_copy_`` stays a write of the new rows). Without AOTAutograd's
    runtime wrappers, which an output sharing an input's memory would need
    (``_returns_input_memory``) to be rebuilt as a view of the updated input."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    functional = torch.func.functionalize(fn, remove="mutations")
    return make_fx(functional, decomposition_table=select_decomp_table(), tracing_mode="fake")(*examples)


def _returns_input_memory(graph: torch.fx.GraphModule) -> bool:
    """Whether a traced (not functionalized) graph returns a tensor that shares memory with one of
    its inputs (the input itself, or a view of it)."""
    (output,) = graph.graph.find_nodes(op="output")
    inputs = _storages(node.meta.get("val") for node in graph.graph.find_nodes(op="placeholder"))
    return bool(_storages(node.meta.get("val") for node in output.all_input_nodes) & inputs)


def _writes_compiled_how(fn, examples: list, graph: torch.fx.GraphModule):
    """For a region that writes its inputs, traced as ``graph``: the graph to hand Inductor
    (functionalized, ``_functionalized``) and None; or, when it returns memory of one of its
    inputs, ``graph`` as it is and the plain graph ``standalone_compile`` takes instead (its
    runtime wrapper returns the caller's tensor)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    plain = make_fx(fn, tracing_mode="fake")(*examples)
    if _returns_input_memory(plain):
        return graph, plain
    return _functionalized(fn, examples), None


def _compile_static(fn, examples: list, options: dict, fingerprint: str | None = None):
    """A region with static sizes, compiled for ``examples``' sizes and strides into a callable
    taking the region's inputs and returning its outputs as a list.

    Traced with Inductor's decompositions and handed to ``compile_fx_inner`` under a fake mode
    with a ShapeEnv of its own (the FX graph cache keys on it); the generated code's entry
    point is called directly. A graph that updates a tensor in place is functionalized first
    (``_functionalized``), unless it returns memory of an input, which goes through
    ``standalone_compile`` (AOTAutograd's functionalization and runtime wrappers).
    ``fingerprint``: the region's (``thunder_core.extend.region_fingerprint``), under which the
    generated code is noted for later processes and found again (``_reuse``).
    """
    building: list = []
    with torch._inductor.config.patch(options):  # Inductor's own settings for this job
        reuse_key = _reuse.region_key(fingerprint, examples)
        call, source = _load_noted(reuse_key)
        if call is None:
            from torch._inductor.compile_fx import compile_fx_inner
            from torch._inductor.decomposition import select_decomp_table
            from torch._subclasses.fake_tensor import FakeTensorMode
            from torch.fx.experimental.proxy_tensor import make_fx
            from torch.fx.experimental.symbolic_shapes import ShapeEnv

            graph = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*examples)
            _computes_something(graph)
            mutates = _mutates(graph)
            if mutates:
                graph, standalone = _writes_compiled_how(fn, examples, graph)
                if standalone is not None:
                    compiled = torch._inductor.standalone_compile(
                        standalone, examples, dynamic_shapes="from_example_inputs"
                    )
                    return lambda *args: compiled(*args)
            fake_mode = FakeTensorMode(shape_env=ShapeEnv())
            fakes = [fake_mode.from_tensor(x, static_shapes=True) for x in examples]
            # cpp_wrapper is an argument here, not read from the config. Inductor's size asserts
            # stay: besides the inputs' (which compile_region compares first) they check what
            # library kernels inside the region return against their meta kernels. A region that
            # writes its inputs builds its kernels now: its first run must not fail after part of
            # its effect.
            building_later = nullcontext() if mutates else _kernels_built_later(building, examples)
            with tracing(TracingContext(fake_mode)), building_later:
                compiled = compile_fx_inner(
                    graph, fakes, cpp_wrapper=bool(torch._inductor.config.cpp_wrapper)
                )
            _built_now(compiled, building)
            _reuse.note(reuse_key, compiled)
            call = compiled.current_callable  # what CompiledFxGraph.__call__ runs, minus its profiler record
            source = getattr(compiled, "source_code", None)

    def run(*args):
        if building:
            _finish(building)
        return call(list(args))

    run.direct, run.building = call, building  # what compile_region's call of these strides runs
    run.source_code = source  # the generated code, for inspection
    return run


def _load_noted(reuse_key: str | None) -> tuple:
    """The entry point and source of the generated module an earlier process noted under
    ``reuse_key``, loaded as Inductor's FX graph cache loads one; (None, None) if there is none
    or it does not load."""
    found = _reuse.find(reuse_key)
    if found is None:
        return None, None
    module_key, path, source = found
    try:  # its kernels load (or build) now: one that fails sends the region to a compile
        return _load_generated(module_key, path, source).call, source
    except Exception:  # noqa: BLE001 - a module that no longer loads: the region is compiled
        return None, None


# Header lines of Inductor's generated modules that import what only some modules use: library
# kernel calls (``extern_kernels``: matmuls, convolutions) and the memory planner's ``align``.
# Importing them is most of a second in a fresh process (select_algorithm compiles its kernel
# templates), and a region without matmuls (most of ours) names neither.
_UNUSED_WHEN_UNNAMED = {
    "from torch._inductor.select_algorithm import extern_kernels\n": "extern_kernels",
    "from torch._inductor.codegen.memory_planning import _align as align\n": "align",
}


def _load_generated(module_key: str, path: str, source: str):
    """The generated module at ``path`` (whose text is ``source``), loaded as Inductor's FX graph
    cache loads it (``PyCodeCache.load_by_key_path``), except that a header import of a name the
    module never uses again is left out."""
    lean = source
    for line, name in _UNUSED_WHEN_UNNAMED.items():
        if line in lean and len(re.findall(rf"\b{name}\b", lean)) == 1:  # the import is the only mention
            lean = lean.replace(line, "\n", 1)  # the lines keep their numbers
    if lean == source:
        return PyCodeCache.load_by_key_path(module_key, path)
    module = _lean_modules.get(path)
    if module is None:
        module = types.ModuleType(f"{__name__}.{module_key}")
        module.__file__ = path
        module.key = module_key
        exec(compile(lean, path, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - Inductor's code
        _lean_modules[path] = module
    return module


_lean_modules: dict[str, types.ModuleType] = {}  # by path, as PyCodeCache keeps the modules it loads


# Inductor's FX graph cache keeps, with each compiled graph, the ShapeEnv's guards on the graph's
# SymInt inputs, and a lookup takes an entry whose guards hold. A symbolic region's graph reads its
# sizes from its tensors and has no SymInt inputs, so its entries keep no guards: code compiled
# under one assumption, the trace's (``1 + s0 // 2 <= s3``: a slice's end inside the dimension) or
# one Inductor makes while compiling (the length ``Min(s0, s1)`` of a ``diagonal`` taken as ``s0``
# while the rows are no more than the columns), would be found again for a trace where the
# opposite holds, and read past a dimension's end or return a wrong size. Symbolic regions are
# therefore compiled without Inductor's and AOTAutograd's graph caches (the builds of their
# kernels are still cached).


def _off(config, *names: str) -> dict:
    return {name: False for name in names if hasattr(config, name)}


class _WithoutArtifactWarning(logging.Filter):
    """``standalone_compile`` warns that it could not save its cache artifacts: with the caches
    off, there are none to save."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "artifact generation failed" not in record.getMessage()


@contextmanager
def _no_autograd_cache():
    """AOTAutograd's cache off, for a symbolic region's compile (``standalone_compile`` goes through it)."""
    from torch._functorch import config as functorch_config

    logger, quiet = logging.getLogger("torch._inductor.standalone_compile"), _WithoutArtifactWarning()
    logger.addFilter(quiet)
    try:
        with functorch_config.patch(
            _off(functorch_config, "enable_autograd_cache", "enable_remote_autograd_cache")
        ):
            yield
    finally:
        logger.removeFilter(quiet)


def _compile_symbolic(fn, examples: list, options: dict):
    """A region with symbolic sizes, compiled once for every size: traced with Inductor's
    decompositions on fake inputs of the trace's ShapeEnv (so what Inductor assumes about the
    sizes becomes the trace's guards) and compiled with those sizes dynamic; its generated code
    is called directly, as for fixed sizes (a graph that writes in place is functionalized first,
    or goes through ``standalone_compile`` when it returns an input's memory). Inputs whose
    strides the compiled code does not expect run the region's operations as they are: the
    generated code asserts an input before the first kernel that reads it, and ``_layout_check``
    checks the others before the call (every input, for a graph that writes)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    examples = [_canonical(x) for x in examples]
    fake_mode, only_ints = _fake_mode(examples)
    # Inputs that are all ints (a mask made from `arange(s0)`): make_fx finds no fake tensor to
    # trace in, so the mode over their ShapeEnv is made active for it to find.
    tracing_in = fake_mode if only_ints else nullcontext()
    # Under the job's settings: Inductor's decompositions read some (emulate_precision_casts).
    with enable_python_dispatcher(), tracing_in, torch._inductor.config.patch(options):
        graph = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*examples)
    _computes_something(graph)
    building: list = []
    no_graph_cache = _off(torch._inductor.config, "fx_graph_cache", "fx_graph_remote_cache")
    with torch._inductor.config.patch({**options, **no_graph_cache}), _no_autograd_cache():
        mutates, standalone = _mutates(graph), None
        if mutates:
            with enable_python_dispatcher(), tracing_in:
                graph, standalone = _writes_compiled_how(fn, examples, graph)
        if standalone is not None:
            compiled = torch._inductor.standalone_compile(standalone, examples, dynamic_shapes="from_graph")
            call = lambda args: compiled(*args)  # noqa: E731
        else:
            # A region that writes its inputs builds its kernels now (see _kernels_built_later).
            building_later = nullcontext() if mutates else _kernels_built_later(building, examples)
            with tracing(TracingContext(fake_mode)), building_later:
                inner = compile_fx_inner(
                    graph, examples, cpp_wrapper=bool(torch._inductor.config.cpp_wrapper)
                )
            _built_now(inner, building)
            call = inner.current_callable  # the generated code, without AOTAutograd's runtime wrappers
    # Every input of a region that writes is checked before the call: the generated code's own
    # checks may come after a kernel that wrote, so a failed one is an error, never a rerun.
    source = None if mutates else getattr(inner, "source_code", None)
    check = _layout_check(examples, _unasserted_inputs(graph, examples, source))

    def run(*args):
        if building:
            _finish(building)
        if check is not None:
            try:
                check(args)
            except AssertionError:  # other strides than traced: nothing has run yet
                return tuple(fn(*args))
        try:
            return call(list(args))
        except AssertionError:  # Inductor's stride assertion: other strides than traced
            if mutates:
                raise
            return tuple(fn(*args))
        except RuntimeError as error:  # the same assertion in a cpp_wrapper module
            if mutates or not _failed_size_assertion(error):
                raise
            return tuple(fn(*args))

    return run


def _canonical(example):
    """An int input as the symbol its ShapeEnv replaced it by (``n`` found equal to ``x.shape[0]``:
    ``s1`` is ``s0``): the traced graph uses that symbol, and the generated code binds the
    symbols of its inputs only."""
    if not isinstance(example, torch.SymInt):
        return example
    node = example.node
    canonical = node.expr  # the replacement (SymNode.expr replaces; the node keeps its own symbol)
    if canonical == getattr(node, "_expr", canonical) or not canonical.is_Symbol:
        return example
    value = node.shape_env.var_to_val.get(canonical)  # a sympy Integer
    return node.shape_env.create_symintnode(canonical, hint=node.hint if value is None else int(value))


def _fake_mode(examples: list):
    """The fake mode of a symbolic region's examples, and whether it was made here: a region
    whose inputs are all ints gets one over their ShapeEnv (the trace's), so that the tensors
    tracing makes have the trace's symbols in their sizes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for x in examples:
        if hasattr(x, "fake_mode"):
            return x.fake_mode, False
    shape_env = next((x.node.shape_env for x in examples if isinstance(x, torch.SymInt)), None)
    if shape_env is None:
        raise RegionNotSupported("inductor: a symbolic region with neither tensor nor symbolic int inputs")
    return FakeTensorMode(shape_env=shape_env), True


_ASSERTED_INPUT = re.compile(r"assert_size_stride\((arg\d+_\d+)\b")


def _unasserted_inputs(graph: torch.fx.GraphModule, examples: list, source: str | None) -> list[int]:
    """Positions of the tensor inputs whose sizes and strides the generated code does not assert.

    Inductor asserts an input just before the first kernel that reads it; an input the graph
    only views (``reshape`` of it returned, which Inductor makes a ``reinterpret_tensor`` with
    the traced strides) is never asserted, so a call with other strides (an expanded gradient)
    would return a view past its storage. Every tensor input when the source is not known."""
    names = [node.name for node in graph.graph.find_nodes(op="placeholder")]
    asserted = set(_ASSERTED_INPUT.findall(source)) if source and len(names) == len(examples) else set()
    return [i for i, x in enumerate(examples) if isinstance(x, torch.Tensor) and names[i] not in asserted]


def _layout_check(examples: list, positions: list[int]):
    """``check(args)``: raises AssertionError (Inductor's own ``assert_size_stride``) when a tensor
    at ``positions`` has other sizes or strides than its example's, the symbols taking the
    values the call's inputs give them; None when there is nothing to check."""
    from torch._C._dynamo.guards import assert_size_stride
    from torch.utils._sympy.printers import PythonPrinter

    if not positions:
        return None
    readings: dict = {}  # sympy symbol -> Python reading its value from the arguments
    for i, x in enumerate(examples):
        if isinstance(x, torch.SymInt):
            values = [(x, f"args[{i}]")]
        elif isinstance(x, torch.Tensor):
            values = [(s, f"args[{i}].shape[{d}]") for d, s in enumerate(x.shape)]
            values += [(s, f"args[{i}].stride({d})") for d, s in enumerate(x.stride())]
        else:
            continue
        for value, reading in values:
            if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
                readings.setdefault(value.node.expr, reading)
    printer, lines, used = PythonPrinter(), [], set()

    def text(values) -> str:
        parts = []
        for value in values:
            if isinstance(value, torch.SymInt):
                expr = value.node.expr
                if not expr.free_symbols <= readings.keys():
                    raise RegionNotSupported("inductor: a size of a region input no input gives")
                used.update(expr.free_symbols)
                parts.append(printer.doprint(expr))
            else:
                parts.append(str(value))
        return "(" + "".join(f"{p}, " for p in parts) + ")"

    for i in positions:
        x = examples[i]
        lines.append(f"    assert_size_stride(args[{i}], {text(x.shape)}, {text(x.stride())})")
    bindings = [f"    {symbol} = {readings[symbol]}" for symbol in sorted(used, key=str)]
    source = "def check(args):\n" + "\n".join(bindings + lines) + "\n"
    namespace = {"assert_size_stride": assert_size_stride}
    exec(compile(source, "<thunder_executor_inductor layout check>", "exec"), namespace)  # noqa: S102
    return namespace["check"]


def _failed_size_assertion(error: RuntimeError) -> bool:
    """Whether ``error`` is Inductor's C++ ``assert_size_stride`` (cpp_wrapper) refusing a tensor."""
    return str(error).startswith(("expected size ", "expected ndim "))
