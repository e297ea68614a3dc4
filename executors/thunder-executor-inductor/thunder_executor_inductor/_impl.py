"""The Inductor executor: each region of a trace compiled once by torch.compile.

Regions hold what Inductor fuses well (elementwise ops, reductions, norms, softmax, views,
indexing, cat); matmuls, attention and embeddings stay with the torch executor, whose
kernels Inductor would call anyway. Identical regions (the same ops on the same metadata,
as in every layer of a transformer) share one compiled function.
"""

from __future__ import annotations

import torch

from thunder_core import FusionExecutor, Rejection
from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.symbols import INPLACE, OPAQUE, RANDOM
from thunder_core.ir.tree import leaves
from thunder_core.ops import TORCH_SYMBOLS, prims

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
    inputs = tuple((tuple(p.shape), p.dtype, tuple(p.stride()), p.device) for p in region.inputs)
    outputs = tuple(canonical(p) for p in region.outputs)
    return tuple(ops), inputs, outputs


class InductorExecutor(FusionExecutor):
    default_priority = 10
    min_region_size = 4

    def __init__(self):
        super().__init__("inductor", version=torch.__version__)
        self._compiled: dict[tuple, object] = {}
        for symbol in TORCH_SYMBOLS.values():
            if symbol.name not in EXTERNAL and not symbol.has_tag(RANDOM):
                self.register_supported(symbol)
        for symbol in prims.PRIMS.values():
            if not symbol.has_tag(RANDOM) and symbol.name != "matmul":
                self.register_supported(symbol)

    def check(self, bsym):
        verdict = super().check(bsym)
        if verdict is not True:
            return verdict
        if bsym.symbol.has_tag(INPLACE) or bsym.symbol.has_tag(OPAQUE):
            return Rejection("inductor regions are functional: no in-place or opaque calls")
        for x in leaves((bsym.args, bsym.kwargs, bsym.output)):
            if isinstance(x, TensorProxy) and (x.dtype.is_complex or x.numel() == 0):
                return Rejection("inductor: complex or empty tensor")
        if not any(isinstance(x, TensorProxy) for x in leaves(bsym.output)):
            return Rejection("inductor: the op returns no tensor")
        return True

    def compile_region(self, region):
        key = _signature(region)
        compiled = self._compiled.get(key)
        if compiled is None:
            fn = region.as_trace(f"inductor_region_{len(self._compiled)}").python_callable()
            compiled = torch.compile(fn, fullgraph=True, dynamic=False)
            self._compiled[key] = compiled
        return compiled
