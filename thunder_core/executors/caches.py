"""Timing a candidate as the program runs it: with its inputs out of the CPU's caches.

Measured selection runs each candidate on the same inputs again and again. On a CPU those
inputs then sit in the last-level cache, while in the program they were mostly written long
before (a tensor the forward saved, read by the backward) and come from memory. A candidate that
passes over its inputs several times (a region run op by op) looks as fast as one that passes
once (a fused kernel) when everything is cached, and is slower in the program: measured that
way, selection kept such candidates and made a Llama training step 10% slower than claim order.
So before each timed run the caches are filled with other data, as the rest of the program
would have done.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from thunder_core.ir.tree import leaves

DEFAULT_CACHE_BYTES = 32 * 2**20  # when the system does not say


def last_level_cache_bytes() -> int:
    """The size of the CPU's largest cache, from sysfs (Linux); ``DEFAULT_CACHE_BYTES`` otherwise."""
    largest = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            largest = max(largest, int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        pass
    return largest or DEFAULT_CACHE_BYTES


def _nothing() -> None:
    pass


def _cpu_bytes(args, kwargs) -> int:
    tensors = [x for x in leaves((args, kwargs)) if isinstance(x, torch.Tensor) and x.device.type == "cpu"]
    return sum(x.untyped_storage().nbytes() for x in tensors)


class CacheEvictor:
    """Pushes a candidate's inputs out of the CPU's caches before each timed run, by reading as
    much other memory as the largest cache holds.

    One evictor serves the measured claims of one program: its buffer is made at the first claim
    whose inputs need it and freed when the last of its ``users`` is done (``release``). Inputs
    smaller than ``SMALL_INPUT_BYTES`` are not evicted: a value that small was most likely just
    written by the operation before, and is in the cache in the program too.
    """

    SMALL_INPUT_BYTES = 2**20

    def __init__(self, users: int):
        self.users = users
        self._buffer: torch.Tensor | None = None

    def for_inputs(self, args, kwargs) -> Callable[[], None]:
        if _cpu_bytes(args, kwargs) < self.SMALL_INPUT_BYTES:
            return _nothing
        if self._buffer is None:
            self._buffer = torch.ones(last_level_cache_bytes() // 4, dtype=torch.float32)
        buffer = self._buffer

        def evict() -> None:
            buffer.sum()  # reading it brings other data into every cache level

        return evict

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self._buffer = None
