"""thunder-plugin-distributed: the ``ddp`` and ``fsdp`` plugins of thunder-core, on torch.distributed.

Under ``torchrun``, after ``torch.distributed.init_process_group()``::

    model = thunder_core.jit(model, plugins=["fsdp"], options={"fsdp": {"zero": 3}})
    optimizer = torch.optim.AdamW(model.parameters())   # after jit: it steps the shards

or select the plugin by configuration (``THUNDER_CORE_PLUGINS=ddp``). See docs/distributed.md.
"""

from __future__ import annotations

from thunder_plugin_distributed.checkpoint import load_optimizer_state_dict, optimizer_state_dict
from thunder_plugin_distributed.fsdp import clip_grad_norm_, full_state_dict

__all__ = ["clip_grad_norm_", "full_state_dict", "load_optimizer_state_dict", "optimizer_state_dict"]
