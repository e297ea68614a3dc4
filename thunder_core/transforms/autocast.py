"""Autocast as a trace transform: casts before the ops torch.autocast runs in another dtype.

Used in two ways: when a jitted function is called inside ``torch.autocast(...)`` (the core
captures the program without autocast, then makes autocast's casts explicit ops of the trace,
so every executor sees the dtypes that really flow), and by the ``autocast`` plugin, which
applies the same rules without an autocast context.

Pre: a captured trace. Post: the same program with ``to`` casts in front of the operations
that autocast runs in lower precision, in float32, or in the widest input dtype.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves, tree_map
from thunder_core.transforms.autocast_policy import FLOAT32, LOWER, PROMOTE, policy
from thunder_core.transforms.replay import replay

DEVICE_TYPES = ("cpu", "cuda")


def ambient_autocast() -> dict[str, torch.dtype]:
    """The device types ``torch.autocast`` is enabled for right now, with their dtypes."""
    return {d: torch.get_autocast_dtype(d) for d in DEVICE_TYPES if torch.is_autocast_enabled(d)}


@contextmanager
def autocast_disabled(device_types):
    """Turn autocast off for ``device_types`` (capture records the casts explicitly instead)."""
    with ExitStack() as stack:
        for device_type in device_types:
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _device_type(args, kwargs) -> str | None:
    for x in leaves((args, kwargs)):
        if isinstance(x, TensorProxy):
            return x.device.type
    return None


def _cast(dtype):
    from thunder_core.ops import TORCH_SYMBOLS

    to = TORCH_SYMBOLS["to"]

    def cast(x):
        if isinstance(x, TensorProxy) and x.dtype.is_floating_point and x.dtype != dtype:
            return to(x, dtype)
        return x

    return cast


def autocast_transform(trace: Trace, dtypes: dict[str, torch.dtype], *, name: str = "autocast") -> Trace:
    """Insert the casts ``torch.autocast`` would make, per device type (``{"cpu": torch.bfloat16}``)."""

    def visit(bsym, args, kwargs):
        device_type = _device_type(args, kwargs)
        low = dtypes.get(device_type or "")
        if low is None:
            return bsym.symbol(*args, **kwargs)
        rule = policy(bsym.symbol.name, device_type)
        if rule == LOWER:
            args, kwargs = tree_map(_cast(low), args), tree_map(_cast(low), kwargs)
        elif rule == FLOAT32:
            args, kwargs = tree_map(_cast(torch.float32), args), tree_map(_cast(torch.float32), kwargs)
        elif rule == PROMOTE:
            floats = [
                x.dtype
                for x in leaves((args, kwargs))
                if isinstance(x, TensorProxy) and x.dtype.is_floating_point
            ]
            if floats:
                widest = max(floats, key=lambda d: torch.finfo(d).bits)
                args, kwargs = tree_map(_cast(widest), args), tree_map(_cast(widest), kwargs)
        return bsym.symbol(*args, **kwargs)

    return replay(trace, visit, name=name)
