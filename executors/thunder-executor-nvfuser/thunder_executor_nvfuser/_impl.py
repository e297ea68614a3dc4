"""The nvFuser executor: each region's recipe built into a FusionDefinition, cached per recipe."""

from __future__ import annotations

try:
    from nvfuser import DataType, FusionDefinition
except ImportError:  # the direct bindings of newer releases
    from nvfuser_direct import DataType, FusionDefinition

from thunder_core.extend import (
    FusionExecutor,
    RegionNotSupported,
    Rejection,
    TensorProxy,
    leaves,
    prim_symbols,
    torch_symbols,
)
from thunder_executor_nvfuser.translate import (
    DTYPES,
    RENAMED,
    SAME_NAME,
    Ref,
    recipe,
    recipe_key,
    untranslatable,
)

PRIMS = SAME_NAME | set(RENAMED) | {"sum", "var", "convert_element_type", "broadcast_in_dim", "reshape",
                                    "squeeze", "slice", "cat"}  # fmt: skip


def _build(steps) -> FusionDefinition:
    with FusionDefinition() as fd:
        values = {}

        def resolve(x):
            if isinstance(x, Ref):
                return values[x.name]
            if isinstance(x, list):
                return [resolve(y) for y in x]
            return x

        for result, op, args, kwargs in steps:
            kwargs = {k: getattr(DataType, v) if k == "dtype" else v for k, v in kwargs.items()}
            if op == "define_tensor":
                values[result] = fd.define_tensor(**kwargs)
            elif op == "define_scalar":
                values[result] = fd.define_scalar(*args, **kwargs)
            elif op == "outputs":
                for out in args:
                    fd.add_output(values[out.name])
            else:
                values[result] = getattr(fd.ops, op)(*[resolve(a) for a in args], **kwargs)
    return fd


class NvFuserExecutor(FusionExecutor):
    default_priority = 20

    def __init__(self):
        super().__init__("nvfuser")
        self._fusions: dict[str, FusionDefinition] = {}
        for name in PRIMS:
            self.register_supported(prim_symbols()[name])
        for symbol in torch_symbols().values():
            if symbol.decomposition is not None:
                self.register_supported(symbol)

    def check(self, bsym):
        verdict = super().check(bsym)
        if verdict is not True:
            return verdict
        for x in leaves((bsym.args, bsym.kwargs, bsym.output)):
            if isinstance(x, TensorProxy) and (x.device.type != "cuda" or x.dtype not in DTYPES):
                return Rejection(
                    "nvFuser runs CUDA tensors of float, half, bfloat16, double, int or bool dtypes"
                )
        reason = untranslatable(bsym)
        return Rejection(f"nvfuser cannot translate it: {reason}") if reason else True

    def compile_region(self, region):
        try:
            steps = recipe(region.bound_symbols, region.inputs, region.outputs)
        except RegionNotSupported:
            raise
        key = recipe_key(steps)
        fd = self._fusions.get(key)
        if fd is None:
            fd = self._fusions[key] = _build(steps)

        def run(*tensors):
            return tuple(fd.execute(list(tensors)))

        return run
