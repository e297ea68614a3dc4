"""The ``after_capture`` pass: ``linear`` of a dequantized weight -> the low-bit kernel."""

from __future__ import annotations

from thunder_core.extend import BoundSymbol, Trace, leaves
from thunder_plugin_quantization.symbols import int4_linear, int8_linear


def use_low_bit_kernels(trace: Trace, options: dict) -> Trace:
    dequantized = {}
    for bsym in trace.bound_symbols:
        if bsym.symbol.name in ("quant_dequantize_int8", "quant_dequantize_int4"):
            dequantized[bsym.output.name] = bsym
    if not dequantized:
        return trace
    rewritten = []
    for bsym in trace.bound_symbols:
        replacement = _low_bit_linear(bsym, dequantized)
        rewritten.append(replacement if replacement is not None else bsym)
    return trace.with_bound_symbols(_without_unused(rewritten, trace.output, set(dequantized)))


def _low_bit_linear(bsym: BoundSymbol, dequantized: dict) -> BoundSymbol | None:
    if bsym.symbol.name != "linear":
        return None
    x, weight, *rest = bsym.args
    bias = rest[0] if rest else bsym.kwargs.get("bias")
    source = dequantized.get(getattr(weight, "name", None))
    if source is None or x.dtype != weight.dtype or x.device != weight.device:
        return None  # another dtype (autocast) or device: the dequantized weight stays correct
    if source.symbol.name == "quant_dequantize_int8":
        q, scale = source.args
        return BoundSymbol(int8_linear, (x, q, scale, bias), {}, bsym.output, source=bsym.source)
    packed, scales_and_zeros, group_size, weight_shape = source.args
    args = (x, packed, scales_and_zeros, group_size, weight_shape, bias)
    return BoundSymbol(int4_linear, args, {}, bsym.output, source=bsym.source)


def _without_unused(bsyms: list[BoundSymbol], output, removable: set[str]) -> list[BoundSymbol]:
    used = {p.name for p in leaves(output) if hasattr(p, "name")}
    for bsym in bsyms:
        used.update(p.name for p in bsym.flat_args())
    return [
        b
        for b in bsyms
        if not (
            b.output is not None
            and getattr(b.output, "name", None) in removable
            and b.output.name not in used
        )
    ]
