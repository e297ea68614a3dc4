"""thunder-plugin-quantization: weight-only int8 / int4 quantization of linear layers.

    jitted = thunder_core.jit(model, plugins=["quantize-int8"])
    jitted = thunder_core.jit(model, plugins=["quantize-int4"], options={"quantize-int4": {"group_size": 64}})

Weights are quantized once, at wrap time (the model's memory shrinks); the matmuls run on
PyTorch's low-bit CPU kernels. ``report(jitted)`` lists the layers quantized and skipped.
"""

from __future__ import annotations

from thunder_plugin_quantization.quantize import QuantizationReport, report

__all__ = ["QuantizationReport", "report"]
