"""Answers about metadata kept on disk (``thunder_core.ops.kept_answers``): a later process
captures without asking PyTorch's meta kernels and type promotion again, and gets eager's
results, dtypes and strides; what the answers depend on is part of the question."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import torch

import thunder_core

# Broadcasting, a transposed input, type promotion (an integer tensor, a Python float, a
# zero-dim tensor), reductions, matmul: operations whose metadata comes from Python meta kernels.
PROGRAM = """
import json, sys, torch, thunder_core

if sys.argv[1] == "float64":
    torch.set_default_dtype(torch.float64)


def program(x, y, n, s):
    a = x + y.t()
    b = n * 1.5 + s
    c = (a.sum(0, keepdim=True) - a).relu() @ y
    d = torch.where(x > 0, x, -x).mean(dim=1)
    return a, b, c, d


x = torch.randn(4, 3)
y = torch.randn(3, 4)
n = torch.arange(6).reshape(2, 3)
s = torch.tensor(2.0)
jitted = thunder_core.jit(program, executors=["torch"])
got, want = jitted(x, y, n, s), program(x, y, n, s)
asked_pytorch = "sympy" in sys.modules  # PyTorch's meta kernels and promotion import it; assert_close does too
for g, w in zip(got, want):
    torch.testing.assert_close(g, w)
    assert g.dtype == w.dtype and g.stride() == w.stride(), (g.dtype, w.dtype, g.stride(), w.stride())
print(json.dumps({"asked_pytorch": asked_pytorch, "dtype": str(got[1].dtype)}))
"""


def _run(script, *args) -> dict:
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _entries() -> list[str]:
    folder = os.path.join(os.environ["THUNDER_CORE_CACHE_DIR"], "metadata-v1")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)) if os.path.isdir(folder) else []


def test_a_later_process_captures_with_the_kept_answers_and_gets_eagers_results(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    first = _run(script, "default")
    assert first["asked_pytorch"] and len(_entries()) == 1
    second = _run(script, "default")
    assert not second["asked_pytorch"]  # every answer came from the disk
    assert second["dtype"] == "torch.float32"


def test_the_default_dtype_is_part_of_the_question(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    _run(script, "default")
    other = _run(script, "float64")  # int tensor * 1.5 is float64 under this default: asked again
    assert other["asked_pytorch"] and other["dtype"] == "torch.float64"
    again = _run(script, "float64")
    assert not again["asked_pytorch"] and again["dtype"] == "torch.float64"


def test_nothing_is_kept_when_the_cache_is_off(monkeypatch):
    own = os.environ["THUNDER_CORE_CACHE_DIR"]
    monkeypatch.setenv("THUNDER_CORE_CACHE_DIR", "off")
    x = torch.randn(3, 2)
    jitted = thunder_core.jit(lambda a: (a * 2).t() + 1, executors=["torch"])
    torch.testing.assert_close(jitted(x), (x * 2).t() + 1)
    monkeypatch.setenv("THUNDER_CORE_CACHE_DIR", own)  # the test's own cache directory: still empty
    assert _entries() == []
    thunder_core.jit(lambda a: (a * 3).t() - 1, executors=["torch"])(x)
    assert len(_entries()) == 1


def test_a_damaged_entry_is_ignored_with_one_warning():
    def f(a, b):
        return (a - b).abs().sum(1)

    a, b = torch.randn(5, 4), torch.randn(4)
    thunder_core.jit(f, executors=["torch"])(a, b)
    (entry,) = _entries()
    with open(entry, "r+b") as file:
        data = bytearray(file.read())
        data[-5] ^= 0x01
        file.seek(0)
        file.write(data)
    from thunder_core.ops import kept_answers

    kept_answers._stores.clear()  # as a new process: read the entry again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(
            thunder_core.jit(lambda a, b: (b - a).abs().sum(1), executors=["torch"])(a, b),
            (b - a).abs().sum(1),
        )
    assert any("damaged or foreign compile cache entry" in str(w.message) for w in caught)
