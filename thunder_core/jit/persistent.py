"""Captured traces reused across processes: what an on-disk entry holds and when it is used.

An entry is keyed (``key_material``) by the versions of Python, torch and thunder-core (and a
hash of thunder-core's sources), the torch global state, the process's rank in a distributed
job, the jitted function's code and module class, the call's cache key (input metadata and
Python values), the jit options, the job (executors, plugins, their options and versions) and
the guard walk of the module tree. It holds the captured trace (``trace_data``), the guard
checks the capture was specialized on in process-independent form
(``fingerprint.guard_tokens``), the globals each user code object read, the values read from
library modules (``sys.argv``, ``torch.backends...``), and where to find each code object that
ran with a hash of it (``fingerprint.code_identity``).

A new process with the same key replays the recorded global reads and uses the stored trace
only if every check and value comes out the same and every code object that ran while
capturing is, in this process, the same code; the checks it walked become the new entry's
guard, as if it had captured. Autodiff, the transforms, executor claiming and the executors'
own caches (Inductor's, Numba's) run as usual. Programs whose capture cannot be described so (a
real tensor read from a closure, a hook, an ``autograd.Function``, symbolic sizes, code that
cannot be found again by its name, a capture that changed Python state) are simply not stored.
"""

from __future__ import annotations

import json
import sys
import time

from thunder_core.disk_cache import DiskCache, digest
from thunder_core.ir.trace import Provenance
from thunder_core.jit.fingerprint import (
    ambient_torch_state,
    code_changed,
    code_fingerprint,
    code_identity,
    environment,
    guard_tokens,
    qualified_name,
    stable_value,
)
from thunder_core.jit.trace_data import NotPersistable, trace_from_data, trace_to_data


def _job_description(job) -> dict:
    if job is None:
        return {}
    from thunder_core.plugins.manager import plugin_manager

    config = job.config
    return {
        "executors": job.executor_names,
        "executor_options": stable_value(_items(job.executor_options)),
        "passes": {
            stage: [[name, stable_value(_items(options))] for _, options, name in entries]
            for stage, entries in job.passes.items()
        },  # fmt: skip
        "module_transforms": [
            [name, stable_value(_items(options))] for _, options, name in job.module_transforms
        ],
        "config": [config.select, config.strict, config.cpu_memory] if config is not None else None,
        "versions": sorted(
            [info.name, info.version or "", info.status]
            for info in plugin_manager().plugins.values()
            if info.registered
        ),
    }


def _items(options) -> list:
    """A dict of options as sorted pairs (nested dicts too), for ``stable_value``."""
    if isinstance(options, dict):
        return [[str(k), _items(v)] for k, v in sorted(options.items(), key=lambda kv: str(kv[0]))]
    if isinstance(options, (list, tuple)):
        return [_items(v) for v in options]
    return options


def _root(root, fn) -> dict:
    """The module class (or function) the program belongs to, and the function captured: its
    name and a hash of its code (two methods of one module are two programs)."""
    import torch

    owner = qualified_name(type(root)) if isinstance(root, torch.nn.Module) else None
    fn = getattr(fn, "__func__", fn)  # a bound method
    return {"module": owner, "function": qualified_name(fn), "code": code_fingerprint(fn)}


def key_material(
    root, fn, key: tuple, names: list[str], state_names: list[str], options: dict, job, builder
) -> dict:
    """What a stored trace is keyed on, the walk of the roots in ``builder`` included (so
    programs that differ in a module attribute are two entries); raises ``NotPersistable`` for a
    call it cannot describe."""
    return {
        "environment": environment(),
        "torch_state": ambient_torch_state(),
        "root": _root(root, fn),
        "call": stable_value(key),
        "names": list(names),
        "state": list(state_names),
        "options": stable_value(_items(options)),
        "job": _job_description(job),
        "tree": guard_tokens(builder.tokens[: builder.tree_checks]),
    }


def restore(cache: DiskCache, material: dict, builder) -> tuple[object | None, str]:
    """The stored captured trace for ``material`` if it holds here, with the global reads it
    recorded replayed into ``builder`` (already holding the walk of the roots); else None and
    why not ("" when there is no entry). Never raises: an entry that cannot be used is a miss."""
    start = time.perf_counter()
    try:
        entry = cache.load(digest(material))
        if entry is None:
            return None, ""
        if json.dumps(entry["material"], sort_keys=True) != json.dumps(material, sort_keys=True):
            return None, "the disk cache entry was written for another call"
        changed = code_changed(entry["code"])
        if changed is not None:
            return None, f"the disk cache entry is stale: the code of {changed} changed"
        for module_name, chains in entry["global_reads"]:
            module = sys.modules.get(module_name)
            if module is None:
                return None, f"the disk cache entry reads globals of {module_name}, which is not imported"
            builder.globals_of(None, vars(module), [tuple(chain) for chain in chains])
        try:
            tokens = guard_tokens(builder.tokens)
            reads = _stable_reads(builder)
        except NotPersistable as reason:
            return None, f"the disk cache entry cannot be checked here ({reason})"
        if json.dumps(tokens) != json.dumps(entry["tokens"]):  # as text: 2 == 2.0, "2" != "2.0"
            return (
                None,
                f"the disk cache entry is stale: {_first_difference(entry['tokens'], tokens)} changed",
            )
        if json.dumps(reads) != json.dumps(entry["stable_reads"]):
            return (
                None,
                f"the disk cache entry is stale: {_first_difference(entry['stable_reads'], reads, 0)} changed",
            )
        trace = trace_from_data(entry["trace"])
    except Exception as error:  # noqa: BLE001 - a damaged or incompatible entry is a miss, never a failure
        return None, f"the disk cache entry could not be used ({type(error).__name__}: {error})"
    trace.provenance = Provenance(
        "the disk cache (captured by an earlier process)", time.perf_counter() - start
    )
    return trace, ""


def _stable_reads(builder) -> list:
    return [[path, stable_value(value)] for path, value in builder.stable_reads]


def _first_difference(stored: list, now: list, field: int = 1) -> str:
    for a, b in zip(stored, now):
        if a != b:
            return str(b[field])
    return "the number of values the program reads"


def save(cache: DiskCache, material: dict, compiled, builder) -> str:
    """Store ``compiled``'s captured trace; returns "" or why it was not stored. Never raises."""
    try:
        if compiled.lifted:
            raise NotPersistable("the program reads tensors that are not its inputs (globals, closures)")
        if builder.not_replayable is not None:
            raise NotPersistable(builder.not_replayable)
        if builder.random_generators:
            raise NotPersistable("the program reads a NumPy random generator")
        if compiled.guard is not None and compiled.guard.failures():
            raise NotPersistable("the program changes Python state it reads")
        entry = {
            "material": material,
            "trace": trace_to_data(compiled.captured),
            "tokens": guard_tokens(builder.tokens),
            "stable_reads": _stable_reads(builder),
            "global_reads": [
                [name, [list(chain) for chain in chains]] for name, chains in builder.global_reads
            ],
            "code": [code_identity(name, code) for name, code in builder.codes_run],
        }
        cache.store(digest(material), entry)
    except NotPersistable as reason:
        return f"not stored in the disk cache: {reason}"
    except Exception as error:  # noqa: BLE001 - a full disk, an unreadable file: the job goes on
        return f"not stored in the disk cache: {type(error).__name__}: {error}"
    return ""
