"""A region's prims as a recipe of FusionDefinition calls (pure logic, no nvFuser needed).

Each step is ``(result, op, args, kwargs)``: ``op`` is ``"define_tensor"`` for inputs, an
``fd.ops`` name otherwise; arguments name earlier results by ``Ref``.
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


def recipe(bsyms, inputs, outputs) -> list[tuple]:
    steps = []
    for p in inputs:
        if p.dtype not in DTYPES:
            raise Unsupported(f"dtype {p.dtype}")
        contiguity = [True] * p.ndim if p.is_contiguous() else [None] * p.ndim
        steps.append(
            (
                p.name,
                "define_tensor",
                (),
                {"shape": list(p.shape), "contiguity": contiguity, "dtype": DTYPES[p.dtype]},
            )
        )

    def ref(x):
        return Ref(x.name) if isinstance(x, TensorProxy) else x

    for b in _prims(bsyms):
        name = b.symbol.name
        (out,) = b.flat_outputs() if len(b.flat_outputs()) == 1 else (None,)
        if out is None:
            raise Unsupported(f"prims.{name} has several outputs")
        args = [ref(a) for a in b.args]
        if name in SAME_NAME:
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
