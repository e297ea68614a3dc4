"""The Inductor executor: each region of a trace compiled once by Inductor.

Regions hold what Inductor fuses well (elementwise ops, reductions, norms, softmax, views,
indexing, cat); matmuls, attention and embeddings stay with the torch executor, whose
kernels Inductor would call anyway. Identical regions (the same ops on the same metadata,
as in every layer of a transformer) share one compiled function.

A region is traced to an ATen graph with ``make_fx`` (Inductor's decompositions applied) and
compiled by Inductor's graph compiler, ``compile_fx_inner``; each call goes straight to the
generated code: no Dynamo frame and guards (the thunder_core cache already guarantees the
metadata) and none of AOTAutograd's runtime wrappers, which a region (functional, called
without autograd) does not need and which cost a few microseconds per call, more with cold
caches between large matmuls. Regions with symbolic sizes go through
``torch._inductor.standalone_compile``, which keeps their sizes dynamic. Inductor's on-disk FX
graph cache makes a second process's compiles cheap either way.

The executor compiles in the background (``compiles_in_background``): a recompiled program's
regions run as torch operations while Inductor compiles them on thunder_core's worker thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch._inductor
import torch._inductor.compile_fx  # noqa: F401 - what standalone_compile runs; imported here, once
from torch._guards import TracingContext, tracing
from torch._inductor import cpu_vec_isa
from torch._inductor.compile_fx import compile_fx_inner
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from thunder_core import FusionExecutor, RegionNotSupported, Rejection
from thunder_core.extend import (
    COMPILE_LOCK,
    INPLACE,
    OPAQUE,
    RANDOM,
    VIEW_OPS,
    SymbolicSizeError,
    TensorProxy,
    leaves,
    prim_symbols,
    symbolic_examples,
    torch_symbols,
)

# Kernels Inductor calls as external libraries: fusing around them buys nothing here.
EXTERNAL = {"matmul", "mm", "bmm", "linear", "scaled_dot_product_attention", "embedding", "cross_entropy"}


def _signature(region) -> tuple:
    """Region identity up to names: the printed ops with canonical names, and input metadata."""
    names: dict[str, str] = {}

    def canonical(x):
        if isinstance(x, TensorProxy):
            return names.setdefault(x.name, f"v{len(names)}")
        if isinstance(x, (list, tuple)):
            return tuple(canonical(y) for y in x)
        if isinstance(x, dict):
            return tuple((k, canonical(v)) for k, v in x.items())
        return repr(x)

    for p in region.inputs:
        canonical(p)
    ops = []
    for b in region.bound_symbols:
        ops.append((b.symbol.printed_name, canonical(b.args), canonical(b.kwargs), canonical(b.output)))
    inputs = tuple((_sizes(p.shape), p.dtype, _sizes(p.stride()), p.device) for p in region.inputs)
    outputs = tuple(canonical(p) for p in region.outputs)
    return tuple(ops), inputs, outputs


def _symbolic_environment(region):
    """The ShapeEnv of a region's symbolic sizes or strides, if it has any."""
    for p in region.inputs:
        for s in (*p.shape, *p.stride()):
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def _sizes(sizes) -> tuple:
    return tuple(str(s) if isinstance(s, torch.SymInt) else s for s in sizes)


REGIONS = ("fusion", "maximal")


class InductorExecutor(FusionExecutor):
    """Inductor on regions of the trace; ``regions="maximal"`` also claims matmuls and attention."""

    default_priority = 10
    min_region_size = 2
    views_after_region = True  # Inductor keeps each result's strides; a returned view is rebuilt per call
    takes_symbolic_sizes = True  # a region with symbolic sizes compiles once, size-generic
    compiles_in_background = True  # a recompile's regions run with torch until Inductor is done

    def __init__(self, regions: str = "fusion", inductor_options: dict | None = None, warm_up=None):
        if regions not in REGIONS:
            raise ValueError(f"inductor: regions must be one of {REGIONS}, got {regions!r}")
        super().__init__("inductor", version=torch.__version__)
        self.regions = regions
        self.inductor_options = dict(inductor_options or {})
        self._compiled: dict[tuple, object] = {}
        self._variants: dict[tuple, InductorExecutor] = {}
        if warm_up is None:
            # Inductor's one-time set-up runs while thunder_core captures and differentiates.
            warm_up = threading.Thread(target=_warm_up, name="thunder-inductor-warm-up", daemon=True)
            warm_up.start()
        self._warm_up = warm_up
        maximal = regions == "maximal"
        for symbol in torch_symbols().values():
            if (maximal or symbol.name not in EXTERNAL) and not symbol.has_tag(RANDOM):
                self.register_supported(symbol)
        for symbol in prim_symbols().values():
            if not symbol.has_tag(RANDOM) and (maximal or symbol.name != "matmul"):
                self.register_supported(symbol)
        if maximal:
            self.min_region_size = 1

    def with_options(self, options: dict) -> InductorExecutor:
        """The executor for one job: its region mode and Inductor's own options."""
        inductor_options = {}
        if options.get("cpp_wrapper"):
            inductor_options["cpp_wrapper"] = True
        if options.get("max_autotune"):
            inductor_options["max_autotune"] = True
        regions = options.get("regions", "fusion")
        if regions == self.regions and inductor_options == self.inductor_options:
            return self
        key = (regions, tuple(sorted(inductor_options.items())))
        if key not in self._variants:
            self._variants[key] = InductorExecutor(regions, inductor_options, warm_up=self._warm_up)
        return self._variants[key]

    def finer_variant(self):
        """Maximal regions are measured against fusion regions plus the rest of the job."""
        if self.regions != "maximal":
            return None
        return "inductor(fusion)", self.with_options({"regions": "fusion", **self.inductor_options})

    def check(self, bsym):
        verdict = super().check(bsym)
        if verdict is not True:
            return verdict
        if bsym.symbol.has_tag(INPLACE) or bsym.symbol.has_tag(OPAQUE):
            return Rejection("inductor regions are functional: no in-place or opaque calls")
        for x in leaves((bsym.args, bsym.kwargs, bsym.output)):
            if isinstance(x, TensorProxy) and x.dtype.is_complex:
                return Rejection("inductor: complex tensor")
        if not any(isinstance(x, TensorProxy) for x in leaves(bsym.output)):
            return Rejection("inductor: the op returns no tensor")
        return True

    def materializes(self, bsym) -> bool:
        """Inductor calls library kernels (matmul, attention) on buffers in memory."""
        return bsym.symbol.name in EXTERNAL

    def region_weight(self, region) -> int:
        """Operations that compute something: views alone never make a region worth compiling."""
        if self.regions == "maximal" and any(b.symbol.name in EXTERNAL for b in region):
            return 1 << 30
        return sum(1 for b in region if b.symbol.name not in VIEW_OPS)

    def compile_region(self, region):
        self._warm_up.join()
        key = _signature(region)
        environment = _symbolic_environment(region)
        # A region with symbolic sizes is shared only within its trace's ShapeEnv, where the
        # guards its compile added live (and it goes away with it).
        cache = (
            self._compiled
            if environment is None
            else environment.__dict__.setdefault("thunder_core_inductor", {})
        )
        compiled = cache.get(key)
        if compiled is None:
            compiled = cache[key] = _compile(region, f"inductor_region_{len(cache)}", self.inductor_options)
        return compiled


def _warm_up() -> None:
    """Probe the CPU's vector ISAs, which Inductor does once per process before its first compile.

    The probe is mostly waiting for child processes that load a test library, one per
    candidate ISA (about 1 s here), so it runs beside capture, and the candidates in parallel;
    each candidate's result is cached, so Inductor's own ``valid_vec_isa_list()`` reuses them.
    Failures are left for the real compile to report. The compiler itself is imported by
    this module, on the importing thread: imports running in two threads at once can race.
    """
    try:
        flags = cpu_vec_isa.x86_isa_checker()
        candidates = [
            isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())
        ]
        with ThreadPoolExecutor(max(1, len(candidates))) as pool:
            list(pool.map(bool, candidates))
        cpu_vec_isa.valid_vec_isa_list()
    except Exception:  # noqa: BLE001 - internal APIs that may change; the compile reports real problems
        pass


def _compile(region, name: str, options: dict):
    """One region as an Inductor-compiled callable taking the region's inputs.

    Compiled code asserts its inputs' strides. The trace's metadata predicts them, but a value
    made by another executor may arrive with other strides (an expanded gradient that came out
    contiguous, say); such calls get a variant compiled for the strides they bring.
    """
    if not all(isinstance(p, TensorProxy) for p in region.inputs):
        raise RegionNotSupported("inductor: a region input is not a tensor")
    try:
        fn = region.as_trace(name).python_callable()
    except SymbolicSizeError as error:
        raise RegionNotSupported(f"inductor: {error}") from error
    examples = symbolic_examples(region.inputs)
    if examples is not None:
        return _compile_symbolic(fn, examples, options)
    specs = [(tuple(p.shape), p.dtype, p.device) for p in region.inputs]

    def compile_for(strides: tuple):
        examples = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for (shape, dtype, device), stride in zip(specs, strides)
        ]
        return _compile_static(fn, examples, options)

    expected = tuple(tuple(p.stride()) for p in region.inputs)
    compiled = compile_for(expected)
    variants = {expected: compiled}

    def run(*args):
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


def _computes_something(graph) -> None:
    if not any(node.op == "call_function" for node in graph.graph.nodes):
        raise RegionNotSupported("inductor: the region computes nothing (its ops are no-ops here)")


def _mutates(graph) -> bool:
    """Whether a traced region updates a tensor in place (a decomposition may write into a buffer
    it made); such graphs need AOTAutograd's functionalization before Inductor."""
    for node in graph.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _compile_static(fn, examples: list, options: dict):
    """A region with static sizes, compiled for ``examples``' sizes and strides into a callable
    taking the region's inputs and returning its outputs as a list.

    Traced with Inductor's decompositions and handed to ``compile_fx_inner`` under a fake mode
    with a ShapeEnv of its own (the FX graph cache keys on it); the generated code's entry
    point is called directly. A graph that updates a tensor in place goes through
    ``standalone_compile`` (AOTAutograd's functionalization) instead.
    """
    graph = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*examples)
    _computes_something(graph)
    with torch._inductor.config.patch(options):  # Inductor's own settings for this job
        if _mutates(graph):
            graph = make_fx(fn, tracing_mode="fake")(*examples)
            compiled = torch._inductor.standalone_compile(
                graph, examples, dynamic_shapes="from_example_inputs"
            )
            return lambda *args: compiled(*args)
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        fakes = [fake_mode.from_tensor(x, static_shapes=True) for x in examples]
        with tracing(TracingContext(fake_mode)):  # cpp_wrapper is an argument here, not read from the config
            compiled = compile_fx_inner(graph, fakes, cpp_wrapper=bool(torch._inductor.config.cpp_wrapper))
    call = compiled.current_callable  # what CompiledFxGraph.__call__ runs, minus its profiler record

    def run(*args):
        return call(list(args))

    run.source_code = getattr(compiled, "source_code", None)  # the generated code, for inspection
    return run


def _compile_symbolic(fn, examples: list, options: dict):
    """A region with symbolic sizes, compiled once for every size: traced on fake inputs of the
    trace's ShapeEnv (so what Inductor assumes about the sizes becomes the trace's guards) and
    compiled with those sizes dynamic. Inputs whose strides the compiled code does not expect
    (it asserts them before computing) run the region's operations as they are."""
    graph = make_fx(fn, tracing_mode="fake")(*examples)
    _computes_something(graph)
    with torch._inductor.config.patch(options):
        compiled = torch._inductor.standalone_compile(graph, examples, dynamic_shapes="from_graph")

    def run(*args):
        try:
            return tuple(compiled(*args))
        except AssertionError:  # Inductor's stride assertion: other strides than traced
            return tuple(fn(*args))

    return run
