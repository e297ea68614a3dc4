"""A region's prims as a recipe of FusionDefinition calls (pure logic, no nvFuser needed).

Each step is ``(result, op, args, kwargs)``: ``op`` is ``"define_tensor"`` for inputs,
``"define_scalar"`` for the Python numbers an operation takes (nvFuser's ops take Tensor and
Scalar handles, not Python numbers), an ``fd.ops`` name otherwise; arguments name earlier
results by ``Ref``. Inputs are described the way nvFuser describes a tensor: ``contiguity`` is
None exactly for broadcast dims (size 1 or stride 0), and ``stride_order`` gives each dim's rank
among the strides (0 = the smallest).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thunder_core.extend import RegionNotSupported, TensorProxy, flatten_to_prims

DTYPES = {torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float64: "Double",
          torch.int64: "Int", torch.int32: "Int32", torch.bool: "Bool"}  # fmt: skip
SAME_NAME = {"add", "sub", "mul", "div", "neg", "exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf",
             "sqrt", "rsqrt", "reciprocal", "abs", "sin", "cos", "pow", "maximum", "minimum", "where", "eq",
             "ne", "lt", "le", "gt", "ge", "permute", "matmul", "floor", "ceil", "trunc", "sign"}  # fmt: skip
RENAMED = {"amax": "max", "amin": "min"}


class Unsupported(RegionNotSupported):
    pass


@dataclass(frozen=True)
class Ref:
    name: str


_prims = flatten_to_prims


# Ops whose Python-number arguments are operands (elementwise): those become define_scalar.
ELEMENTWISE = SAME_NAME - {"permute", "matmul"}


def tensor_descriptor(shape, strides) -> tuple[list, list[int]]:
    """(contiguity, stride_order) of a tensor, as nvFuser's define_tensor takes them."""
    n = len(shape)
    inner_first = sorted(range(n), key=lambda d: (strides[d], -d))
    stride_order = [0] * n
    for rank, d in enumerate(inner_first):
        stride_order[d] = rank
    contiguity: list = [None] * n
    expected = 1
    for d in inner_first:
        if shape[d] == 1 or strides[d] == 0:
            continue  # a broadcast dim: None
        contiguity[d] = strides[d] == expected
        expected = strides[d] * shape[d]
    return contiguity, stride_order


def _scalar_dtype(value) -> str:
    return "Bool" if isinstance(value, bool) else ("Int" if isinstance(value, int) else "Double")


def recipe(bsyms, inputs, outputs) -> list[tuple]:
    steps = []
    for p in inputs:
        if p.dtype not in DTYPES:
            raise Unsupported(f"dtype {p.dtype}")
        contiguity, stride_order = tensor_descriptor(tuple(p.shape), tuple(p.stride()))
        steps.append(
            (
                p.name,
                "define_tensor",
                (),
                {"shape": list(p.shape), "contiguity": contiguity, "dtype": DTYPES[p.dtype],
                 "stride_order": stride_order},
            )
        )  # fmt: skip
    scalars = iter(range(1_000_000))

    def ref(x):
        return Ref(x.name) if isinstance(x, TensorProxy) else x

    def operand(x):
        if isinstance(x, (bool, int, float)):
            name = f"scalar{next(scalars)}"
            steps.append((name, "define_scalar", (x,), {"dtype": _scalar_dtype(x)}))
            return Ref(name)
        return ref(x)

    for b in _prims(bsyms):
        name = b.symbol.name
        (out,) = b.flat_outputs() if len(b.flat_outputs()) == 1 else (None,)
        if out is None:
            raise Unsupported(f"prims.{name} has several outputs")
        args = [ref(a) for a in b.args]
        if name in ELEMENTWISE:
            steps.append((out.name, name, tuple(operand(a) for a in b.args), {}))
        elif name in SAME_NAME:
            steps.append((out.name, name, tuple(args), {}))
        elif name in RENAMED:
            steps.append((out.name, RENAMED[name], (args[0], list(args[1])), {"keepdim": False}))
        elif name == "sum":
            steps.append(
                (out.name, "sum", (args[0], list(args[1])), {"keepdim": False, "dtype": DTYPES[out.dtype]})
            )
        elif name == "var":
            steps.append((out.name, "var", (args[0], list(args[1]), args[2]), {"keepdim": False}))
        elif name == "convert_element_type":
            steps.append((out.name, "cast", (args[0],), {"dtype": DTYPES[out.dtype]}))
        elif name == "broadcast_in_dim":
            steps.append(
                (
                    out.name,
                    "broadcast_in_dim",
                    (args[0],),
                    {"shape": list(args[1]), "broadcast_dims": list(args[2])},
                )
            )
        elif name == "reshape":
            steps.append((out.name, "reshape", (args[0], list(out.shape)), {}))
        elif name == "squeeze":
            steps.append((out.name, "squeeze", (args[0], list(args[1])), {}))
        elif name == "slice":
            strides = list(args[3]) if len(args) > 3 and args[3] else [1] * len(args[1])
            steps.append((out.name, "slice", (args[0], list(args[1]), list(args[2]), strides), {}))
        elif name == "cat":
            steps.append((out.name, "cat", ([ref(t) for t in b.args[0]], args[1]), {}))
        else:
            raise Unsupported(f"prims.{name} has no nvFuser translation here")
    steps.append((None, "outputs", tuple(Ref(p.name) for p in outputs), {}))
    return steps


def recipe_key(steps) -> str:
    """A cache key of a recipe: its steps with results renamed by position (the wiring stays in)."""
    names = {}
    for index, (result, *_rest) in enumerate(steps):
        if result is not None:
            names[result] = f"v{index}"

    def canonical(x):
        if isinstance(x, Ref):
            return Ref(names.get(x.name, x.name))
        if isinstance(x, (list, tuple)):
            return type(x)(canonical(y) for y in x)
        return x

    return repr([(names.get(r, r), op, canonical(args), sorted(kw.items())) for r, op, args, kw in steps])


def untranslatable(bsym) -> str | None:
    """Why ``bsym`` cannot become part of a recipe, or None: the checker claims only what translates."""
    inputs, seen = [], set()
    for p in bsym.flat_args():
        if isinstance(p, TensorProxy) and p.name not in seen:
            seen.add(p.name)
            inputs.append(p)
    try:
        recipe([bsym], inputs, [p for p in bsym.flat_outputs() if isinstance(p, TensorProxy)])
    except RegionNotSupported as reason:
        return str(reason)
    return None
