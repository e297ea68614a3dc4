"""Regions an earlier process compiled are loaded again without tracing or compiling them
(``thunder_executor_inductor._reuse``), and only when everything that made their code matches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, os
import torch
import thunder_core
from torch._inductor import compile_fx

compiles = []  # Inductor's graph compiles in this process
compile_graph = compile_fx.compile_fx_inner


def counting(*args, **kwargs):
    compiles.append(1)
    return compile_graph(*args, **kwargs)


compile_fx.compile_fx_inner = counting
if os.environ.get("CUSTOM_PASS"):
    torch._inductor.config.post_grad_custom_post_pass = lambda graph: None


def f(a, b):
    return (a.sin() * b).softmax(-1) + a.cos() * 2


x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
y = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
cache = os.environ["REGION_CACHE"]
jf = thunder_core.jit(
    f,
    executors=["inductor"],
    cache_dir=None if cache == "none" else cache,
    options={"inductor": json.loads(os.environ.get("INDUCTOR_OPTIONS", "{}"))},
)
results = [jf(x, y), jf(x * 3, y)]
regions = [b for b in thunder_core.last_traces(jf)[-1].bound_symbols if b.executor == "inductor"]
print(json.dumps({
    "compiles": len(compiles),
    "same": all(torch.allclose(r, f(a, y)) for r, a in zip(results, (x, x * 3))),
    "regions": len(regions),
    "failures": [str(getattr(b.impl, "failure", None)) for b in regions if getattr(b.impl, "failure", None)],
}))
"""


def _child(tmp_path: Path, source: str, cache: str, **env) -> dict:
    """``source`` run in a fresh process with Inductor's cache in ``tmp_path``: its last line, as JSON."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "REGION_CACHE": cache, **env}
    done = subprocess.run(
        [sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Inductor's code ran, with eager's results
    assert result["same"] and result["regions"] >= 1 and not result.get("failures"), result
    return result


def _run(tmp_path: Path, cache: str, **env) -> dict:
    return _child(tmp_path, _CHILD, cache, **env)


def _noted_modules(cache: Path) -> list[str]:
    entries = sorted((cache / "inductor-regions-v1").glob("*.json"))
    return [json.loads(path.read_bytes().partition(b"\n")[2])["module"] for path in entries]


def test_a_later_process_loads_the_regions_generated_code_without_compiling(tmp_path):
    cache = str(tmp_path / "thunder")
    first = _run(tmp_path, cache)
    assert first["compiles"] >= 1
    assert _noted_modules(tmp_path / "thunder")  # the module Inductor wrote, noted
    second = _run(tmp_path, cache)
    assert second["compiles"] == 0, second  # loaded, neither traced nor compiled


def test_a_noted_module_that_changed_is_not_loaded(tmp_path):
    cache = str(tmp_path / "thunder")
    _run(tmp_path, cache)
    for module in _noted_modules(tmp_path / "thunder"):
        with open(module, "a") as f:
            f.write("\n# changed after it was noted\n")
    again = _run(tmp_path, cache)
    assert again["compiles"] >= 1, again  # compiled as usual


def test_other_inductor_settings_compile_again(tmp_path):
    cache = str(tmp_path / "thunder")
    _run(tmp_path, cache)
    other = _run(tmp_path, cache, INDUCTOR_OPTIONS=json.dumps({"cpp_wrapper": True}))
    assert other["compiles"] >= 1, other
    assert _run(tmp_path, cache, INDUCTOR_OPTIONS=json.dumps({"cpp_wrapper": True}))["compiles"] == 0


def test_a_job_without_a_disk_cache_notes_nothing(tmp_path):
    _run(tmp_path, "none")
    assert _run(tmp_path, "none")["compiles"] >= 1
    assert not (tmp_path / "thunder").exists()


def test_nothing_is_noted_while_a_custom_inductor_pass_is_set(tmp_path):
    """A user's pass changes the generated code in ways no setting describes: nothing is kept."""
    cache = str(tmp_path / "thunder")
    assert _run(tmp_path, cache, CUSTOM_PASS="1")["compiles"] >= 1
    assert not _noted_modules(tmp_path / "thunder")


_LOADER_CHILD = """
import json, os, sys
import torch
import thunder_core


def f(a, b):
    return ((a.sin() * b) @ b.T @ b).relu() + a.cos() * 2


x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
y = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
regions = os.environ["REGIONS"]
jf = thunder_core.jit(f, executors=["inductor"], cache_dir=os.environ["REGION_CACHE"],
                      options={"inductor": {"regions": regions}})
result = jf(x, y)
ran = [b for b in thunder_core.last_traces(jf)[-1].bound_symbols if b.executor == "inductor"]
print(json.dumps({
    "same": torch.allclose(result, f(x, y), atol=1e-5),
    "regions": len(ran),
    "select_algorithm": "torch._inductor.select_algorithm" in sys.modules,
    "compiled": "torch._inductor.compile_fx" in sys.modules,
}))
"""


def _load(tmp_path: Path, regions: str) -> dict:
    return _child(tmp_path, _LOADER_CHILD, str(tmp_path / "thunder"), REGIONS=regions)


def test_a_loaded_module_imports_inductors_kernel_selection_only_when_it_calls_a_library_kernel(tmp_path):
    """Generated code imports ``extern_kernels`` (select_algorithm, most of a second to import)
    in its header whether it calls a library kernel or not; a loaded region without one does
    not import it, a region with a matmul in it does, and both compute eager's result."""
    assert _load(tmp_path, "fusion")["compiled"]  # the first process compiles
    fusion = _load(tmp_path, "fusion")
    assert not fusion["compiled"] and not fusion["select_algorithm"], fusion
    _load(tmp_path, "maximal")
    maximal = _load(tmp_path, "maximal")  # the matmul inside the region: extern_kernels.mm
    assert not maximal["compiled"] and maximal["select_algorithm"], maximal
