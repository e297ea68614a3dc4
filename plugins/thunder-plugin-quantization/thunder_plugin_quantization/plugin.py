"""The hooks of ``quantize-int8`` and ``quantize-int4`` (two entry points, one module each below)."""

from __future__ import annotations

import torch

from thunder_core.extend import Availability

KERNELS = {
    "int8": ("_weight_int8pack_mm",),
    "int4": ("_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu"),
}
SKIP_DEFAULT = ["lm_head", "*.lm_head"]


def probe(kind: str) -> Availability:
    missing = [op for op in KERNELS[kind] if not hasattr(torch.ops.aten, op)]
    if missing:
        return Availability.missing(
            f"this torch ({torch.__version__}) has no {', '.join(missing)}", "install torch>=2.6"
        )
    return Availability.ok()


def declare_options(declare, kind: str) -> None:
    declare(
        "skip",
        list,
        SKIP_DEFAULT,
        "fnmatch patterns of linear layer names left in float (the LM head by default)",
    )
    if kind == "int4":
        declare("group_size", int, 64, "input features per scale and zero point: 32, 64, 128 or 256")


def register_module_transform(register, kind: str) -> None:
    from thunder_plugin_quantization.quantize import quantize_module

    register(lambda module, options: quantize_module(module, kind, options), name=f"quantize-{kind}")


def register_passes(register) -> None:
    from thunder_plugin_quantization.rewrite import use_low_bit_kernels

    register("after_capture", use_low_bit_kernels, name="low-bit kernels")
