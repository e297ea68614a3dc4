"""Measured selection times each run on a copy of the inputs that is out of the CPU's caches."""

from __future__ import annotations

import torch

from thunder_core.executors.caches import MIN_RING_BYTES, SMALL_INPUT_BYTES, ColdInputs
from thunder_core.executors.selection import _time_interleaved

CACHE = 8 * SMALL_INPUT_BYTES  # a cache size for the tests, independent of this machine's


def test_small_inputs_are_used_as_they_are():
    x = torch.randn(16)
    inputs = ColdInputs((x,), {"scale": torch.randn(4)}, cache_bytes=CACHE)
    assert inputs.copies == 1
    args, kwargs = inputs.next()
    assert args[0] is x and inputs.next()[0][0] is x


def test_a_small_weight_is_copied_too_but_not_a_tiny_one():
    """A parameter is read once per call of the program, after the rest of the call pushed it
    out of the caches: timed cached, a one-row linear on it looked faster in ATen than in the
    kernel that is faster in the program."""
    weight = torch.nn.Parameter(torch.randn(128, 128))  # 64 KiB
    inputs = ColdInputs((torch.randn(1, 128), weight), {}, cache_bytes=CACHE)
    assert inputs.copies * (weight.nbytes + 128 * 4) >= CACHE
    copies = {inputs.next()[0][1].data_ptr() for _ in range(inputs.copies)}
    assert len(copies) == inputs.copies and weight.data_ptr() not in copies
    norm_weight = torch.nn.Parameter(torch.randn(128))  # a few cache lines: not worth copies
    assert ColdInputs((torch.randn(1, 128), norm_weight), {}, cache_bytes=CACHE).copies == 1


def test_large_inputs_rotate_through_copies_that_together_fill_the_cache():
    x = torch.randn(64, SMALL_INPUT_BYTES // 4 // 64).t()  # a transposed (dense) layout
    flag = True
    inputs = ColdInputs((x, flag), {"other": torch.randn(8)}, cache_bytes=CACHE)
    size = x.nbytes + 8 * 4
    assert inputs.copies * size >= CACHE
    turns = [inputs.next() for _ in range(inputs.copies)]
    for (copy, same_flag), kwargs in turns:
        assert copy.stride() == x.stride() and torch.equal(copy, x) and same_flag is flag
        assert kwargs["other"].shape == (8,)
    pointers = [copy.data_ptr() for (copy, _), _ in turns]
    assert len(set(pointers)) == inputs.copies and x.data_ptr() not in pointers
    assert inputs.next()[0][0].data_ptr() == pointers[0]  # then the first copy again


def test_views_with_gaps_or_overlaps_are_passed_as_they_are():
    base = torch.randn(2 * SMALL_INPUT_BYTES // 4)
    every_other = base[::2]  # gaps: a copy would read other memory
    expanded = torch.randn(1, 1024).expand(1024, 1024)  # overlaps
    dense = torch.randn(SMALL_INPUT_BYTES // 4)
    inputs = ColdInputs((every_other, expanded, dense), {}, cache_bytes=CACHE)
    (a, b, c), _ = inputs.next()
    assert a is every_other and b is expanded and c is not dense and torch.equal(c, dense)


def test_inputs_as_large_as_the_cache_are_not_copied():
    x = torch.randn(CACHE // 4)
    assert ColdInputs((x,), {}, cache_bytes=CACHE).copies == 1


def test_each_timed_run_reads_another_copy():
    x = torch.randn(SMALL_INPUT_BYTES // 4)
    read = {"a": [], "b": []}

    def candidate(name):
        def run(t):
            read[name].append(t.data_ptr())
            return t + 1

        return run

    inputs = ColdInputs((x,), {}, cache_bytes=32 * SMALL_INPUT_BYTES)  # more copies than runs
    seconds = _time_interleaved({"a": candidate("a"), "b": candidate("b")}, inputs)
    assert set(seconds) == {"a", "b"} and all(s > 0 for s in seconds.values())
    runs = read["a"] + read["b"]
    assert len(runs) >= 2 and len(set(runs)) == len(runs)  # no copy read twice in a few rounds
    assert x.data_ptr() not in runs


def test_no_more_copies_than_timed_runs():
    """A small weight in a large cache would take hundreds of copies, of which a measurement of
    a few rounds reads a few: as many as the runs, plus one, are made."""
    weight = torch.nn.Parameter(torch.randn(512, 512))  # 1 MiB
    assert ColdInputs((torch.randn(1, 512), weight), {}, cache_bytes=4 * CACHE).copies > 24
    assert ColdInputs((torch.randn(1, 512), weight), {}, cache_bytes=4 * CACHE, runs=20).copies == 21
    small = torch.nn.Parameter(torch.randn(128, 128))  # 64 KiB: never fewer copies than fill 8 MiB
    copies = ColdInputs((torch.randn(1, 128), small), {}, cache_bytes=4 * CACHE, runs=7).copies
    assert copies * small.nbytes >= MIN_RING_BYTES
