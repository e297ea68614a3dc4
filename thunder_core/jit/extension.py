"""``ModuleExtension``: how a plugin's module transform changes a jitted module.

A plugin registers a module transform (``thunder_core_register_module_transform``); when a
job that selects the plugin jits a module, the transform may change the module in place and
return an extension. The jitted module consults its extensions, in the order the plugins
were selected, wherever a plugin can make a difference:

- ``inputs``: on every call, the tensors the trace takes for the parameters and buffers (a
  DTensor parameter's local tensor, through a differentiable ``to_local()``).
- ``bind``: while the forward is captured, what the module sees in place of each parameter
  and buffer. Ops recorded here are part of the trace (a sharded parameter is gathered, a
  replicated one marked for gradient synchronisation), so autodiff differentiates them.
- ``cache_key``: a value that selects the compiled entry (a trace with or without
  gradient synchronisation).
- ``no_sync``: a context in which gradients are not synchronised (gradient accumulation).
- ``state_dict`` / ``load_state_dict``: the module's state in the form the plugin keeps it.
"""

from __future__ import annotations

from collections.abc import Hashable
from contextlib import AbstractContextManager


class ModuleExtension:
    """Base class of what a module transform returns; override the methods that apply."""

    #: Shown in ``cache_info`` reasons and errors.
    name: str = "extension"

    def bind(self, names: list[str], proxies: list) -> list:
        """What the forward sees for each parameter or buffer (``names`` are their full names),
        called while the forward is recorded. Return ``proxies`` unchanged, or a list of the
        same length with some replaced by the outputs of symbols called here."""
        return proxies

    def inputs(self, names: list[str], tensors: list) -> list:
        """The tensors the trace takes for the parameters and buffers (``names`` are their full
        names), read on every call: ``tensors`` unchanged, or some replaced (a DTensor parameter
        by its local tensor, through a differentiable ``to_local()``). ``bind`` then sees proxies
        of what this returns."""
        return tensors

    def cache_key(self) -> Hashable:
        """A value that is part of the cache key of every call (``None``: nothing)."""
        return None

    def describe(self) -> dict[str, str]:
        """What ``cache_key`` stands for, for ``cache_info`` reasons (``{"ddp": "gradient sync on"}``)."""
        return {}

    def no_sync(self) -> AbstractContextManager | None:
        """A context in which gradients are not synchronised across processes, or None."""
        return None

    def state_dict(self, module, *args, **kwargs) -> dict | None:
        """The module's state dict as this plugin keeps it, or None to leave it to the module."""
        return None

    def load_state_dict(self, module, state_dict, strict: bool = True):
        """Load ``state_dict`` (as ``state_dict`` returns it, or full tensors); None to leave it to the module."""
        return None
