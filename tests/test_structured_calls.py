"""Calls with keyword arguments and argument objects after their first hit: served by a
generated flattener (``thunder_core.jit.flatten``) that must match exactly what the cache key
matches. Every change the key would see (a value, a type, a dtype, a layout, an aliasing, a
float's sign) must reach the slow path and give eager's result; sizes change freely only where
the entry is symbolic."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch

import thunder_core


@dataclass
class Cache:
    keys: torch.Tensor
    scale: float = 1.0
    causal: bool = True


def decode(x, *, cache: Cache, shift=0.0):
    keys = torch.cat([cache.keys, x], dim=0)
    cache.keys = keys
    scores = keys @ x.t() * cache.scale + shift
    if cache.causal:
        scores = scores.tril(diagonal=keys.shape[0] - x.shape[0])
    return scores.softmax(dim=0)


def _both(jfn, x, cache: Cache, **kwargs):
    reference = copy.deepcopy(cache)
    got = jfn(x, cache=cache, **kwargs)
    want = decode(x, cache=reference, **kwargs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cache.keys, reference.keys)
    return got


def _flattened(jfn) -> int:
    """How many flatteners the entries hold (each made at a call that hit the entry)."""
    return sum(len([f for slot, f in c.fast_paths.items() if f and slot != "tensors"]) for c in jfn._entries)


def test_each_value_the_key_holds_still_decides_after_the_fast_path_is_taken():
    jfn = thunder_core.jit(decode)
    x = torch.randn(1, 8)
    cache = Cache(torch.randn(4, 8))
    for _ in range(3):
        _both(jfn, x, Cache(torch.randn(4, 8)))
    assert _flattened(jfn) >= 1
    hits = thunder_core.cache_info(jfn).hits
    _both(jfn, x, Cache(torch.randn(4, 8)))  # the same structure: served without the key
    assert thunder_core.cache_info(jfn).hits == hits + 1
    # A Python value, a flag, a float's sign, a keyword's type: each is a different program
    _both(jfn, x, Cache(torch.randn(4, 8), scale=0.5))
    _both(jfn, x, Cache(torch.randn(4, 8), causal=False))
    misses = thunder_core.cache_info(jfn).misses
    _both(jfn, x, cache, shift=-0.0)
    _both(jfn, x, Cache(torch.randn(4, 8)), shift=0)
    _both(jfn, x, Cache(torch.randn(4, 8)), shift=torch.tensor(0.5))
    assert thunder_core.cache_info(jfn).misses == misses + 3  # -0.0, an int, a tensor: each its own entry


def test_a_python_number_of_another_type_gives_eagers_dtype():
    def scale(x, *, by):
        return torch.arange(3) * by + x

    jfn = thunder_core.jit(scale)
    x = torch.zeros(3, dtype=torch.int64)
    for _ in range(3):
        assert jfn(x, by=2).dtype == torch.int64
    got, want = jfn(x, by=2.0), scale(x, by=2.0)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_containers_that_index_in_their_own_way_are_read_as_the_key_reads_them():
    class Swapped(dict):  # indexing answers for the other key; iteration is a dict's
        def __getitem__(self, k):
            return dict.__getitem__(self, "b" if k == "a" else "a")

    class Reversed(tuple):
        def __getitem__(self, i):
            return tuple.__getitem__(self, -1 - i)

    def difference(d, *, pair, start=1):
        first, second = pair
        return d["a"] - d["b"] + (first - second) * start

    jfn = thunder_core.jit(difference)
    for _ in range(3):
        d, pair = (
            Swapped(a=torch.full((2,), 10.0), b=torch.ones(2)),
            Reversed((torch.ones(2), torch.zeros(2))),
        )
        torch.testing.assert_close(jfn(d, pair=pair), difference(d, pair=pair))


def test_a_slice_with_parts_the_key_refuses_is_refused_after_the_fast_path_is_taken():
    def take(x, *, s):
        return x[s] * 2

    jfn = thunder_core.jit(take)
    x = torch.arange(6.0)
    for _ in range(3):
        torch.testing.assert_close(jfn(x, s=slice(0, 2)), take(x, s=slice(0, 2)))
    with pytest.raises(TypeError):
        jfn(x, s=slice(0, 2.0))


def test_a_tensor_with_other_metadata_inside_an_object_is_not_taken_for_the_last_one():
    jfn = thunder_core.jit(decode)
    x = torch.randn(1, 8)
    for _ in range(3):
        _both(jfn, x, Cache(torch.randn(4, 8)))
    misses = thunder_core.cache_info(jfn).misses
    _both(jfn, x, Cache(torch.randn(8, 4).t()))  # another layout: the key holds strides
    _both(jfn, x, Cache(torch.randn(4, 8)))
    _both(jfn, x.double(), Cache(torch.randn(4, 8, dtype=torch.float64)))
    leaf = Cache(torch.randn(4, 8, requires_grad=True))
    got = jfn(x, cache=leaf)
    assert got.requires_grad
    assert thunder_core.cache_info(jfn).misses == misses + 3


def test_sizes_change_freely_only_in_the_symbolic_dimension():
    jfn = thunder_core.jit(decode)
    x = torch.randn(1, 8)
    cache = Cache(torch.randn(3, 8))
    for _ in range(12):  # the cache grows by one row per call, as a decoding loop's does
        _both(jfn, x, cache)
    info = thunder_core.cache_info(jfn)
    assert info.entries <= 2
    assert len(jfn._cache) <= 4  # served by the flattener: no key per length
    _both(jfn, torch.randn(2, 8), cache)  # two new rows: another size of a dim that was fixed
    _both(jfn, torch.randn(1, 16), Cache(torch.randn(5, 16)))  # the feature dim changed


def test_an_object_given_twice_after_two_different_ones_is_one_object():
    def append_both(first: list, second: list, x):
        first.append(x + 1)
        second.append(x * 2)
        return x.sum()

    jfn = thunder_core.jit(append_both)
    x = torch.randn(3)
    for _ in range(3):
        a, b = [0], [0]  # no tensor inside: nothing but the lists' identity tells the calls apart
        jfn(a, second=b, x=x)
        assert len(a) == 2 and len(b) == 2
    assert thunder_core.cache_info(jfn).hits == 2
    shared, eager_shared = [0], [0]
    jfn(shared, second=shared, x=x)
    append_both(eager_shared, eager_shared, x)
    assert len(shared) == len(eager_shared) == 3
    for got, want in zip(shared[1:], eager_shared[1:]):
        torch.testing.assert_close(got, want)


def test_a_module_forward_with_keyword_arguments_sees_its_parameters_change():
    model = torch.nn.Linear(8, 8)
    jfn = thunder_core.jit(model)
    x = torch.randn(2, 8)
    for _ in range(3):
        torch.testing.assert_close(jfn(input=x), model(input=x))
    with torch.no_grad():
        model.weight.mul_(2)  # in place: the same tensors, new values
    torch.testing.assert_close(jfn(input=x), model(input=x))
    model.weight = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64))
    model.bias = torch.nn.Parameter(torch.randn(8, dtype=torch.float64))
    torch.testing.assert_close(jfn(input=x.double()), model(input=x.double()))


def test_tensor_calls_of_new_sizes_are_served_by_the_symbolic_entry_within_its_size_guard():
    def attend(q, k):
        return (q @ k.t()).softmax(-1) @ k

    jfn = thunder_core.jit(attend)
    q = torch.randn(1, 8)
    for length in range(3, 12):
        k = torch.randn(length, 8)
        torch.testing.assert_close(jfn(q, k), attend(q, k))
    info = thunder_core.cache_info(jfn)
    assert info.entries == 2 and info.hits >= 6
    assert len(jfn._cache) <= 3  # new lengths did not each add a key
    # A length of 1 (sizes 0 and 1 are not symbolic), a strided cache, another width and dtype:
    # each fails the entry's size guard or metadata and compiles, as the key path would.
    for k in (torch.randn(1, 8), torch.randn(12, 8)[::2], torch.randn(7, 4, dtype=torch.float64)):
        entries = thunder_core.cache_info(jfn).entries
        q_ = q.to(k.dtype)[:, : k.shape[1]]
        torch.testing.assert_close(jfn(q_, k), attend(q_, k))
        assert thunder_core.cache_info(jfn).entries == entries + 1


SCALE = 1.0


class _Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, q, k):
        out = (self.proj(q) @ k.t()).softmax(-1) @ k * SCALE
        return out * 0.5 if self.training else out


def test_a_modules_symbolic_entry_still_sees_its_parameters_mode_and_globals():
    global SCALE
    model = _Scorer().eval()
    jfn = thunder_core.jit(model)
    q = torch.randn(1, 8)

    def same(length: int) -> None:
        k = torch.randn(length, 8)
        got, want = jfn(q, k), model(q, k)
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad

    for length in range(3, 9):
        same(length)
    with torch.no_grad():
        model.proj.weight.mul_(-1)  # in place
    same(10)
    model.proj.weight = torch.nn.Parameter(torch.randn(8, 8))  # replaced
    same(11)
    SCALE = 2.0  # a global the forward reads
    try:
        same(12)
    finally:
        SCALE = 1.0
    model.train()  # the forward branches on it
    same(13)
    with torch.no_grad():
        same(14)


class _Scaled(torch.nn.Module):
    """No parameters or buffers: what a graph Dynamo hands over looks like (its weights and
    numbers are its arguments)."""

    def forward(self, x, weight, scale: float, *, shift=0.0):
        return x @ weight * scale + shift


def test_a_module_without_tensors_of_its_own_takes_the_fast_path_with_numbers_among_its_arguments():
    module = _Scaled()
    jmodule = thunder_core.jit(module)
    x, weight = torch.randn(2, 3), torch.randn(3, 4)
    for _ in range(3):
        torch.testing.assert_close(jmodule(x, weight, 0.5, shift=1.0), module(x, weight, 0.5, shift=1.0))
    assert jmodule._forward._fast_structured is not None  # the next call is served by its flattener
    # a number the key holds still decides: another scale is another program, eager's result
    torch.testing.assert_close(jmodule(x, weight, 2.0, shift=1.0), module(x, weight, 2.0, shift=1.0))
    weight.mul_(3)  # a tensor changed in place: read on this call
    torch.testing.assert_close(jmodule(x, weight, 0.5, shift=1.0), module(x, weight, 0.5, shift=1.0))
