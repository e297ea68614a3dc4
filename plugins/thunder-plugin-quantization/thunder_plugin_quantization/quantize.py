"""The module transform of ``quantize-int8`` / ``quantize-int4``: weights quantized at wrap time.

Each selected ``nn.Linear`` loses its float ``weight`` parameter; the module keeps buffers
instead (int8: ``weight`` int8 ``[N, K]`` and ``weight_scale``; int4: ``weight`` packed uint8
``[N, K/2]`` and ``weight_scales_and_zeros``), so the model's memory shrinks when it is jitted.
While the forward is captured the layer sees its weight dequantized (``symbols``), and the
``rewrite`` pass runs the matmul on the packed weight. The quantized module only runs jitted.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import torch
from torch import nn

from thunder_core.extend import ConfigError, ModuleExtension
from thunder_plugin_quantization import kernels
from thunder_plugin_quantization.symbols import dequantize_int4, dequantize_int8

INT4_GROUP_SIZES = (32, 64, 128, 256)


@dataclass
class QuantizationReport:
    """Which linear layers were quantized, and why the others were not."""

    kind: str
    quantized: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class QuantizedModule(ModuleExtension):
    """The extension of a quantized module: what each quantized layer's forward sees as its weight."""

    def __init__(self, kind: str, group_size: int, report: QuantizationReport, shapes: dict[str, tuple]):
        self.name = f"quantize-{kind}"
        self.kind = kind
        self.group_size = group_size
        self.report = report
        self.shapes = shapes  # layer name -> its weight's (out_features, in_features)

    @torch.no_grad()
    def load_state_dict(self, module, state_dict, strict: bool = True):
        """Loads a float checkpoint too: a quantized layer's float ``weight`` is quantized as at wrap
        time (copying it into the int8 buffer would silently cast it)."""
        converted = dict(state_dict)
        for layer in self.shapes:
            key = f"{layer}.weight" if layer else "weight"
            value = state_dict.get(key)
            if value is None or not value.is_floating_point():
                continue
            prefix = f"{layer}." if layer else ""
            device = module.get_buffer(key).device
            for buffer_name, quantized in _quantized_buffers(
                self.kind, value.to(device), self.group_size
            ).items():
                converted[f"{prefix}{buffer_name}"] = quantized
        return module.load_state_dict(converted, strict=strict)

    def bind(self, names: list[str], proxies: list) -> list:
        by_name = dict(zip(names, proxies))
        out = []
        for name, proxy in zip(names, proxies):
            layer = name.removesuffix(".weight") if name.endswith(".weight") else None
            if layer is None and name == "weight":
                layer = ""
            if layer is not None and layer in self.shapes:
                prefix = f"{layer}." if layer else ""
                if self.kind == "int8":
                    proxy = dequantize_int8(proxy, by_name[f"{prefix}weight_scale"])
                else:
                    sz = by_name[f"{prefix}weight_scales_and_zeros"]
                    proxy = dequantize_int4(proxy, sz, self.group_size, self.shapes[layer])
            out.append(proxy)
        return out


def _shared(module: nn.Module) -> set[int]:
    seen, shared = set(), set()
    for _, owner in module.named_modules(remove_duplicate=False):
        for p in owner._parameters.values():
            if p is not None:
                (shared if id(p) in seen else seen).add(id(p))
    return shared


def _quantized_buffers(kind: str, weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    if kind == "int8":
        q, scale = kernels.quantize_int8(weight)
        return {"weight": q, "weight_scale": scale}
    if weight.device.type == "cpu":
        packed, scales_and_zeros = kernels.quantize_int4(weight, group_size)
    else:
        packed, scales_and_zeros = kernels.quantize_int4_cuda(weight, group_size)
    return {"weight": packed, "weight_scales_and_zeros": scales_and_zeros}


def _has_kernel(op: str, device: torch.device) -> bool:
    key = {"cuda": "CUDA", "cpu": "CPU", "mps": "MPS"}.get(device.type)
    return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


def _why_not(
    name: str, layer: nn.Linear, kind: str, group_size: int, skip: list[str], shared: set[int]
) -> str | None:
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in skip):
        return f"matches a skip pattern {skip}"
    weight = layer.weight
    if weight is None or not isinstance(weight, nn.Parameter):
        return "its weight is not a parameter"
    if id(weight) in shared:
        return "its weight is shared with another layer (tied weights)"
    if weight.dtype not in (torch.float32, torch.bfloat16):
        return f"weight dtype {weight.dtype} (float32 and bfloat16 are quantized)"
    if weight.device.type != "cpu":
        op = "aten::_weight_int8pack_mm" if kind == "int8" else "aten::_weight_int4pack_mm"
        if weight.device.type != "cuda" or not _has_kernel(op, weight.device):
            return f"weight on {weight.device}: this torch has no {op.removeprefix('aten::')} kernel for it"
        if kind == "int4" and (
            weight.dtype != torch.bfloat16 or layer.in_features % 32 or layer.out_features % 8
        ):
            return (
                "int4 on CUDA takes bfloat16 weights with in_features a multiple of 32 and out_features of 8"
            )
    if kind == "int4" and layer.in_features % group_size:
        return f"in_features {layer.in_features} is not a multiple of group_size {group_size}"
    return None


def quantize_module(module: nn.Module, kind: str, options: dict) -> QuantizedModule:
    group_size = options.get("group_size", 0)
    if kind == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ConfigError(f"quantize-int4: group_size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    skip = list(options["skip"])
    report = QuantizationReport(kind)
    shapes = {}
    shared = _shared(module)
    for name, layer in list(module.named_modules()):
        if not isinstance(layer, nn.Linear):
            continue
        reason = _why_not(name, layer, kind, group_size, skip, shared)
        if reason is not None:
            report.skipped[name] = reason
            continue
        weight = layer.weight.detach()
        buffers = _quantized_buffers(kind, weight, group_size)
        if kind == "int4" and weight.device.type != "cpu":
            packed, scales_and_zeros = buffers["weight"], buffers["weight_scales_and_zeros"]
            if not kernels.check_int4_cuda(weight, packed, scales_and_zeros, group_size):
                report.skipped[name] = (
                    "the CUDA int4 kernel did not reproduce the weight (packing check failed)"
                )
                continue
        del layer._parameters["weight"]
        for buffer_name, value in buffers.items():
            layer.register_buffer(buffer_name, value)
        shapes[name] = (layer.out_features, layer.in_features)
        report.quantized.append(name)
    return QuantizedModule(kind, group_size, report, shapes)


def report(jitted_module) -> QuantizationReport | None:
    """What ``quantize-int8`` / ``quantize-int4`` did to a jitted module (None without them)."""
    for extension in getattr(jitted_module, "extensions", ()):
        if isinstance(extension, QuantizedModule):
            return extension.report
    return None
