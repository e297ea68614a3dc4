"""The Inductor executor: each region of a trace compiled once by Inductor.

Regions hold what Inductor fuses well (elementwise ops, reductions, norms, softmax, views,
indexing, cat); matmuls, attention and embeddings stay with the torch executor, whose
kernels Inductor would call anyway. Identical regions (the same ops on the same metadata,
as in every layer of a transformer) share one compiled function.

A region is traced to an ATen graph with ``make_fx`` (Inductor's decompositions applied) and
compiled by Inductor's graph compiler, ``compile_fx_inner`` (``_backend``, imported at the first
region's compile: a job that never compiles a region never imports Inductor); each call goes straight to the
generated code: no Dynamo frame and guards (the thunder_core cache already guarantees the
metadata) and none of AOTAutograd's runtime wrappers, which a functional region called without
autograd does not need and which cost a few microseconds per call, more with cold caches
between large matmuls. A region that writes in place (a cache write in a maximal region) is
functionalized first and compiled the same way, the write becoming Inductor's write into the
input; only one that also returns memory of an input (``keys.detach()``) goes through
``torch._inductor.standalone_compile``, whose runtime wrapper rebuilds that result as the
caller's tensor. Regions with symbolic sizes are compiled once for every size, without
Inductor's graph caches (whose entries keep no guards for them); fixed-size regions also come
from the job's disk cache.

The executor compiles in the background (``compiles_in_background``): a recompiled program's
regions run as torch operations while Inductor compiles them on thunder_core's worker thread.
"""

from __future__ import annotations

import torch

from thunder_core import FusionExecutor, Rejection
from thunder_core.extend import (
    INPLACE,
    OPAQUE,
    RANDOM,
    VIEW_OPS,
    TensorProxy,
    leaves,
    overwrites_in_place,
    prim_symbols,
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
    inputs = tuple(
        (_sizes(p.shape), p.dtype, _sizes(p.stride()), p.device)
        if isinstance(p, TensorProxy)
        else ("int", _sizes([p.value]))  # an int the program takes symbolic
        for p in region.inputs
    )
    outputs = tuple(canonical(p) for p in region.outputs)
    return tuple(ops), inputs, outputs


def _symbolic_environment(region):
    """The ShapeEnv of a region's symbolic sizes or strides, if it has any."""
    for p in region.inputs:
        sizes = (*p.shape, *p.stride()) if isinstance(p, TensorProxy) else (p.value,)
        for s in sizes:
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
    size_symbols_as_ints = True  # Inductor binds a symbol only from a size that is exactly it

    def __init__(self, regions: str = "fusion", inductor_options: dict | None = None):
        if regions not in REGIONS:
            raise ValueError(f"inductor: regions must be one of {REGIONS}, got {regions!r}")
        super().__init__("inductor", version=torch.__version__)
        self.regions = regions
        self.inductor_options = dict(inductor_options or {})
        self._compiled: dict[tuple, object] = {}
        self._variants: dict[tuple, InductorExecutor] = {}
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
        if not options.get("eager_rounding", True):
            inductor_options["emulate_precision_casts"] = False
        regions = options.get("regions", "fusion")
        if regions == self.regions and inductor_options == self.inductor_options:
            return self
        key = (regions, tuple(sorted(inductor_options.items())))
        if key not in self._variants:
            self._variants[key] = InductorExecutor(regions, inductor_options)
        return self._variants[key]

    def finer_variant(self):
        """Maximal regions are measured against fusion regions plus the rest of the job."""
        if self.regions != "maximal":
            return None
        options = {"regions": "fusion", **self.inductor_options}
        if self.inductor_options.get("emulate_precision_casts") is False:
            options["eager_rounding"] = False  # the option's name, as with_options reads it
        return "inductor(fusion)", self.with_options(options)

    def check(self, bsym):
        if overwrites_in_place(bsym) and self.regions == "maximal":
            # A cache write joins the stretch around it: functionalized, then written in place by
            # Inductor. Fusion regions, cut at every matmul, would add a region call and its checks
            # of the written inputs for each write.
            return self._check_overwrite(bsym)
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

    def _check_overwrite(self, bsym):
        for x in leaves((bsym.args, bsym.kwargs)):
            if isinstance(x, TensorProxy) and (x.requires_grad or x.dtype.is_complex):
                return Rejection("inductor: an in-place update of a tensor that requires grad, or complex")
        return True

    def materializes(self, bsym) -> bool:
        """Inductor calls library kernels (matmul, attention) on buffers in memory."""
        return bsym.symbol.name in EXTERNAL

    def region_weight(self, region) -> int:
        """Operations that compute something: views alone never make a region worth compiling."""
        if self.regions == "maximal" and any(b.symbol.name in EXTERNAL for b in region):
            return 1 << 30
        return sum(1 for b in region if b.symbol.name not in VIEW_OPS)

    def prepare_compiles(self) -> None:
        """Import Inductor on this thread (a region's compile is going to the background worker)."""
        _isa_probe().start(self.inductor_options)
        from thunder_executor_inductor import _backend

        _backend.import_compiler()

    def model_compile_starting(self) -> None:
        """Start the CPU's vector ISA check (``_vec_isa``), the longest part of Inductor's first
        compile in a process, while the model is captured."""
        _isa_probe().start(self.inductor_options)

    def compile_region(self, region):
        _isa_probe().start(self.inductor_options)  # its compiler runs while Inductor is imported
        from thunder_executor_inductor import _backend  # Inductor itself, imported at the first compile

        _backend.warm_up()
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
            compiled = cache[key] = _backend.compile_region(
                region, f"inductor_region_{len(cache)}", self.inductor_options
            )
        return compiled


def _isa_probe():
    from thunder_executor_inductor import _vec_isa as probe  # imports the part of Inductor it needs

    return probe
