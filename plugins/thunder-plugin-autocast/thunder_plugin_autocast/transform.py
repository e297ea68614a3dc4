"""The autocast pass: the core's autocast transform with the plugin's dtype option."""

from __future__ import annotations

import torch

from thunder_core.extend import AUTOCAST_DEVICE_TYPES as DEVICE_TYPES
from thunder_core.extend import ConfigError, autocast_transform

_LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast_pass(trace, options):
    """Pre: a captured trace. Post: casts before the ops autocast runs in another dtype."""
    if options["dtype"] not in _LOW:
        raise ConfigError(f"autocast: dtype must be one of {sorted(_LOW)}, got {options['dtype']!r}")
    low = _LOW[options["dtype"]]
    return autocast_transform(trace, dict.fromkeys(DEVICE_TYPES, low))
