"""Measured executor choices kept on disk, for later processes on the same machine.

Which executor runs a claim fastest (``thunder_core.executors.selection``) depends on the
operations, their inputs' metadata, the candidates, the library versions and the machine. A
choice measured once is stored in the on-disk cache (``thunder_core.disk_cache``, kind
``decisions``) under all of these, so a new process takes it without compiling and timing the
other candidates (and without importing their libraries). A stored choice is a speed hint,
never a result: if the chosen candidate fails to compile or run, the claim is measured afresh.
"""

from __future__ import annotations

import functools
import os
import platform
import sys

import torch

from thunder_core.disk_cache import DiskCache, digest, job_disk_cache


def current_store() -> DiskCache | None:
    """Where claims made now read and write measured choices (None: only in memory): the
    job's cache directory (``job_cache_directory``)."""
    return job_disk_cache("decisions")


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _machine(claim: str) -> list:
    gpu = None
    if "cuda" in claim and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    return [platform.machine(), _cpu_model(), os.cpu_count(), torch.get_num_threads(), gpu]


def _package_version(executor) -> str | None:
    package = sys.modules.get(type(executor).__module__.split(".")[0])
    return getattr(package, "__version__", None)


def material(key: tuple) -> dict:
    """A ``claim_key`` (which holds executor objects) as data naming the same choice anywhere."""
    from thunder_core._version import __version__

    owner, executors, candidates, inputs, ops, outputs = key
    claim = repr((inputs, ops, outputs))
    return {
        "versions": [__version__, torch.__version__],
        "machine": _machine(claim),
        "owner": [owner.name, type(owner).__module__],
        "executors": [[e.name, type(e).__module__, _package_version(e)] for e in executors],
        "candidates": list(candidates),
        "claim": claim,
    }


def load(store: DiskCache, key: tuple) -> tuple[str, dict[str, float]] | None:
    """The stored choice for ``key``: the winner's name and the timings it was chosen by."""
    try:
        wanted = material(key)
        body = store.load(digest(wanted))
        if body is None or body["material"] != wanted:
            return None
        return str(body["chosen"]), {str(k): float(v) for k, v in body["seconds"].items()}
    except Exception:  # noqa: BLE001 - an unusable entry: the claim is measured
        return None


def save(store: DiskCache, key: tuple, chosen: str, seconds: dict[str, float]) -> None:
    try:
        wanted = material(key)
        store.store(digest(wanted), {"material": wanted, "chosen": chosen, "seconds": seconds})
    except Exception:  # noqa: BLE001 - a full or read-only disk: the choice stays in memory
        pass
