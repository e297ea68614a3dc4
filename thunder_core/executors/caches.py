"""Timing a candidate as the program runs it: with its inputs out of the CPU's caches.

Measured selection runs each candidate on the same inputs again and again. On a CPU those
inputs then sit in the last-level cache, while in the program they were mostly written long
before (a tensor the forward saved, read by the backward) and come from memory. A candidate that
passes over its inputs several times (a region run op by op) looks as fast as one that passes
once (a fused kernel) when everything is cached, and is slower in the program: measured that
way, selection kept such candidates and made a Llama training step 10% slower than claim order.

So each timed run reads its own copy of the inputs, from a ring of copies larger than the
largest cache: by the time a copy is read again, the other copies have pushed it out. (Filling
the caches with other data before each run does that too, but it also pushes out the code and
Python objects of the call itself, which in the program stay cached between calls: that made
every candidate with a longer Python call path look slower than it is, by up to 100 us.)
"""

from __future__ import annotations

import os

import torch

from thunder_core.ir.tree import leaves, tree_map

DEFAULT_CACHE_BYTES = 32 * 2**20  # when the system does not say
# The most the copies of one claim's inputs hold together. A server CPU's last-level cache (480 MiB
# on some Xeons) is shared by dozens of cores; filling all of it for every claim measured made
# copying take half a second of a first call, and a program's weights that fit in it stay there
# between two calls anyway: past this size a copy is out of the core's own caches, as in the program.
MAX_RING_BYTES = 32 * 2**20
# The least they hold when fewer copies would do for the runs: past a core's own caches.
MIN_RING_BYTES = 8 * 2**20
SMALL_INPUT_BYTES = 2**20  # inputs smaller than this are most likely cached in the program too
COLD_WEIGHT_BYTES = 2**16  # a parameter this large is cold in the program whatever the inputs' size


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


def _dense(x: torch.Tensor) -> bool:
    """Its elements fill its extent once, in some order of the dimensions: no gaps, no overlaps."""
    if x.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(x.shape, x.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _copyable(x) -> bool:
    """A plain CPU tensor that a copy with the same sizes and strides reads in the same order."""
    return type(x) in (torch.Tensor, torch.nn.Parameter) and x.device.type == "cpu" and _dense(x)


def _copy(x):
    if not _copyable(x):
        return x
    copy = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    copy.copy_(x)
    return copy


class ColdInputs:
    """Copies of one claim's inputs, handed out in turn (``next``) so that each timed run finds
    its inputs out of the caches.

    The copies together hold at least the largest cache's size, up to ``MAX_RING_BYTES``.
    Inputs smaller than ``SMALL_INPUT_BYTES`` in all are not copied: a value that small was most
    likely just written by the operation before, and is in the cache in the program too. Inputs
    with a parameter of at least ``COLD_WEIGHT_BYTES`` are copied whatever their size: the
    program reads each weight once per call, after the rest of the call has pushed it out. With
    ``runs`` (the timed runs to come) there are no more copies than runs, unless they would hold
    less than ``MIN_RING_BYTES`` (then the runs would read copies still in the core's caches).
    Timed on a cached 688x256 weight, a decoding step's one-row linear took torch 52 us and
    Numba's kernel 59 us; on cold copies, 113 us and 52 us, as in the program. Views with gaps or overlaps
    (a slice of a larger buffer, an expanded tensor) and tensors of other devices or subclasses
    are passed as they are. The copies live as long as this object.
    """

    def __init__(self, args: tuple, kwargs: dict, cache_bytes: int | None = None, runs: int | None = None):
        copied = [x for x in leaves((args, kwargs)) if _copyable(x)]
        size = sum(x.nbytes for x in copied)
        cache_bytes = min(last_level_cache_bytes(), MAX_RING_BYTES) if cache_bytes is None else cache_bytes
        weight = any(isinstance(x, torch.nn.Parameter) and x.nbytes >= COLD_WEIGHT_BYTES for x in copied)
        cached_in_program = size < SMALL_INPUT_BYTES and not weight
        if cached_in_program or size >= cache_bytes:  # (or too large to be cached at all)
            self._ring = [(args, kwargs)]
        else:
            count = -(-cache_bytes // size) + 1  # the others fill the cache between two reads of one
            if runs is not None:
                # no more copies than timed runs (none is read twice), but past a core's caches
                count = min(count, max(runs + 1, -(-MIN_RING_BYTES // size) + 1))
            with torch.no_grad():
                self._ring = [tree_map(_copy, (args, kwargs)) for _ in range(count)]
        self._turn = 0

    @property
    def copies(self) -> int:
        return len(self._ring)

    def next(self) -> tuple[tuple, dict]:
        args, kwargs = self._ring[self._turn % len(self._ring)]
        self._turn += 1
        return args, kwargs
