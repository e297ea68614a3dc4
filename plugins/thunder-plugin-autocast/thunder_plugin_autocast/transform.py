"""The autocast pass: insert casts so each op runs in the dtype torch.autocast would use."""

from __future__ import annotations

import torch

from thunder_core.ir.proxies import TensorProxy
from thunder_core.ir.tree import leaves, tree_map
from thunder_core.ops import TORCH_SYMBOLS
from thunder_core.plugins.errors import ConfigError
from thunder_core.transforms.replay import replay
from thunder_plugin_autocast.policy import FLOAT32, LOWER, PROMOTE, policy

_LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _device_type(args, kwargs) -> str | None:
    for x in leaves((args, kwargs)):
        if isinstance(x, TensorProxy):
            return x.device.type
    return None


def _cast(dtype):
    to = TORCH_SYMBOLS["to"]

    def cast(x):
        if isinstance(x, TensorProxy) and x.dtype.is_floating_point and x.dtype != dtype:
            return to(x, dtype)
        return x

    return cast


def autocast_pass(trace, options):
    """Pre: a captured trace. Post: casts before the ops autocast runs in another dtype."""
    if options["dtype"] not in _LOW:
        raise ConfigError(f"autocast: dtype must be one of {sorted(_LOW)}, got {options['dtype']!r}")
    low = _LOW[options["dtype"]]

    def visit(bsym, args, kwargs):
        rule = policy(bsym.symbol.name, _device_type(args, kwargs) or "")
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

    return replay(trace, visit, name="autocast")
