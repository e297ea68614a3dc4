"""The ``after_split`` pass: keep what the policy says, recompute the rest in the backward."""

from __future__ import annotations

from thunder_core.extend import ConfigError, TrainingTraces, recompute_in_backward

# Matrix multiplies and attention kernels: what the ``matmuls`` policy saves.
MATMULS = frozenset(
    {
        "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "scaled_dot_product_attention",
        "prims.matmul", "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_efficient_attention",
    }
)  # fmt: skip


def _keep(policy: str, block_inputs: frozenset):
    if policy == "blocks":
        return lambda proxy, producer: proxy.name in block_inputs
    if policy == "matmuls":
        return lambda proxy, producer: producer.symbol.name in MATMULS or "attention" in producer.symbol.name
    if policy == "nothing":
        return lambda proxy, producer: False
    from thunder_plugin_checkpoint import POLICIES

    raise ConfigError(f"checkpoint: policy must be one of {POLICIES}, got {policy!r}")


def checkpoint(traces: TrainingTraces, options: dict) -> TrainingTraces:
    keep = _keep(options["policy"], traces.block_inputs)
    forward, backward = recompute_in_backward(traces.forward, traces.backward, keep)
    return TrainingTraces(forward, backward, traces.block_inputs)
