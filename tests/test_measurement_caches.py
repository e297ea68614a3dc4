"""Measured selection times candidates with their inputs out of the CPU's caches."""

from __future__ import annotations

import torch

from thunder_core.executors.caches import CacheEvictor, last_level_cache_bytes


def test_large_inputs_are_evicted_and_the_buffer_goes_with_the_last_claim():
    caches = CacheEvictor(users=2)
    small = (torch.randn(16),)
    assert caches.for_inputs(small, {})() is None and caches._buffer is None  # small: left in cache
    large = (torch.randn(CacheEvictor.SMALL_INPUT_BYTES // 4 + 1),)
    evict = caches.for_inputs(large, {})
    evict()
    assert caches._buffer is not None and caches._buffer.nbytes == last_level_cache_bytes() // 4 * 4
    caches.release()
    assert caches._buffer is not None  # another claim still to be measured
    caches.release()
    assert caches._buffer is None
    assert CacheEvictor(users=1).for_inputs((torch.randn(2, device="meta"),), {})() is None  # no CPU data
