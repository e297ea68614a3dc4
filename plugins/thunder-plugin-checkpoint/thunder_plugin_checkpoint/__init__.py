"""thunder-plugin-checkpoint: activation checkpointing as a trace transform.

    jitted = thunder_core.jit(model, plugins=["checkpoint"], options={"checkpoint": {"policy": "blocks"}})

The forward saves only what the policy keeps; the backward recomputes the rest, each value just
before its first use. Policies:

- ``blocks`` (default): the tensors entering each repeated block (transformer layer), so the
  backward recomputes one layer's activations at a time;
- ``matmuls``: the outputs of matrix multiplies and attention (the expensive ops), recomputing
  the elementwise and normalization ops between them;
- ``nothing``: only the program's inputs (parameters, the batch): least memory, most compute.

Random ops (dropout) are never recomputed: their outputs are saved, so gradients are unchanged.
"""

from __future__ import annotations

from thunder_core.plugins import hookimpl

POLICIES = ("blocks", "matmuls", "nothing")


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("policy", str, "blocks", f"what the forward saves: one of {POLICIES}")


@hookimpl
def thunder_core_register_passes(register) -> None:
    from thunder_plugin_checkpoint.policy import checkpoint

    register("after_split", checkpoint, name="checkpoint")
