"""Autocast as a trace transform: casts before the ops torch.autocast runs in another dtype.

Used by the ``autocast`` plugin, which applies torch.autocast's rules without an autocast
context. (Inside ``torch.autocast``, capture itself records the casts each operation gets, as
they happen: ``thunder_core.capture.recorder``; the program then runs with autocast off.)

Pre: a captured trace. Post: the same program with ``to`` casts in front of the operations
that autocast runs in lower precision, in float32, or in the widest input dtype.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from thunder_core.ir.trace import Trace
from thunder_core.ops.autocast_policy import DEVICE_TYPES, cast_inputs, proxy_device_type
from thunder_core.transforms.replay import replay

__all__ = ["DEVICE_TYPES", "ambient_autocast", "autocast_disabled", "autocast_transform"]


def ambient_autocast() -> dict[str, torch.dtype]:
    """The device types ``torch.autocast`` is enabled for right now, with their dtypes."""
    return {d: torch.get_autocast_dtype(d) for d in DEVICE_TYPES if torch.is_autocast_enabled(d)}


@contextmanager
def autocast_disabled(device_types):
    """Turn autocast off for ``device_types`` (the program holds autocast's casts as operations)."""
    with ExitStack() as stack:
        for device_type in device_types:
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def autocast_transform(trace: Trace, dtypes: dict[str, torch.dtype], *, name: str = "autocast") -> Trace:
    """Insert the casts ``torch.autocast`` would make, per device type (``{"cpu": torch.bfloat16}``)."""

    def visit(bsym, args, kwargs):
        device_type = proxy_device_type(args, kwargs)
        low = dtypes.get(device_type or "")
        if low is not None:
            args, kwargs = cast_inputs(bsym.symbol.name, device_type, low, args, kwargs)
        return bsym.symbol(*args, **kwargs)

    return replay(trace, visit, name=name)
