"""Regions compiled by an earlier process, found again without tracing or hashing their graphs.

Inductor's FX graph cache makes a later process's compile of a region cheap but not free: the
region is first traced to an ATen graph (``make_fx``), and the graph, its inputs and PyTorch's
own sources are hashed before the cache is read. When the job keeps a disk cache
(thunder-core's ``cache_dir``), the executor notes for each region it compiled which module of
generated code Inductor loaded for it (with the module's SHA-256), under a key of everything
that decides that code: the region's fingerprint (its operations and metadata, the versions of
thunder-core, torch and Python, PyTorch's global state), the strides of its inputs, Inductor's
settings, the CPU's vector instruction set, the C++ compiler and this package's sources. A
later process with the same key loads the module as Inductor's cache would (its kernels come
from Inductor's own cache, or are built again from the module's source if they are gone).

Only graphs compiled for the CPU without constants are noted, and nothing while any of
Inductor's custom passes or partitioners is set. An entry whose module is gone, differs from
the noted hash or does not load (its kernels are built as it loads) is not used: the region is
compiled as usual, and noted again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os

import torch

from thunder_core.extend import job_disk_cache

KIND = "inductor-regions"


@functools.cache
def _sources_hash() -> str:
    """This package's sources: how a region becomes an Inductor graph."""
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()


def kept() -> bool:
    """Whether the job compiling on this thread keeps regions on disk."""
    return job_disk_cache(KIND) is not None


def region_key(fingerprint: str | None, examples: list) -> str | None:
    """The key of a region compiled for ``examples`` under the calling thread's Inductor
    settings; None for a region that is not kept (no fingerprint, not on the CPU, or no disk
    cache for this job)."""
    if fingerprint is None or job_disk_cache(KIND) is None:
        return None
    if any(not isinstance(x, torch.Tensor) or x.device.type != "cpu" for x in examples):
        return None
    try:
        material = _key_material(fingerprint, examples)
    except Exception:  # noqa: BLE001 - Inductor internals of another torch: the region is not kept
        return None
    if material is None:
        return None
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=repr).encode()).hexdigest()


def _key_material(fingerprint: str, examples: list) -> dict | None:
    """Everything the key digests; None while a custom pass or partitioner is set."""
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if any(getattr(config, name, None) for name in config._config if "custom" in name):
        return None  # a user's pass or partitioner: code this key cannot describe
    try:
        settings = config.save_config_portable(ignore_private_configs=False)
    except TypeError:  # an older torch: its public settings
        settings = config.save_config_portable()
    material = {
        "region": fingerprint,
        "strides": [list(x.stride()) for x in examples],
        "inductor": settings,
        "fill_uninitialized_memory": bool(
            getattr(torch.utils.deterministic, "fill_uninitialized_memory", False)
        ),
        "isa": str(pick_vec_isa()),
        "compiler": get_cpp_compiler(),
        "executor": _sources_hash(),
    }
    return material


def find(key: str | None) -> tuple[str, str, str] | None:
    """The generated module noted under ``key`` as (Inductor's key for it, its path, its
    source), if it is still there with the content it had."""
    cache = job_disk_cache(KIND) if key is not None else None
    body = cache.load(key) if cache is not None else None
    if body is None:
        return None
    try:
        module_key, path, sha256 = str(body["key"]), str(body["module"]), str(body["sha256"])
        with open(path, "rb") as f:
            source = f.read()
    except (OSError, KeyError, TypeError):
        return None
    if hashlib.sha256(source).hexdigest() != sha256:
        return None
    return module_key, path, source.decode()


def note(key: str | None, compiled) -> None:
    """Note under ``key`` the module of generated code that ``compiled`` (Inductor's output for
    a region) runs, when it can be loaded on its own: a compiled FX graph without constants."""
    cache = job_disk_cache(KIND) if key is not None else None
    if cache is None or type(compiled).__name__ != "CompiledFxGraph":
        return
    if compiled.constants or getattr(compiled, "opaque_value_type_classes", None):
        return
    scope = getattr(compiled.current_callable, "__globals__", {})
    module_key, path = scope.get("key"), scope.get("__file__")
    if (
        not isinstance(module_key, str)
        or not isinstance(path, str)
        or scope.get("call") is not compiled.current_callable
    ):
        return
    try:
        with open(path, "rb") as f:
            sha256 = hashlib.sha256(f.read()).hexdigest()
        cache.store(key, {"key": module_key, "module": path, "sha256": sha256})
    except OSError:  # a full or read-only disk: the next process compiles as usual
        pass
