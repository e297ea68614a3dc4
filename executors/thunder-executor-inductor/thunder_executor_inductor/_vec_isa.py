"""Inductor's probe of the CPU's vector ISAs, started before Inductor itself is imported.

Before its first compile Inductor builds and loads a test library per vector ISA; the probe is
mostly waiting for the compiler, so the executor starts it on a thread of its own and imports
the rest of Inductor (most of a second) meanwhile: ``start()`` then ``wait()`` before compiling.
Only what the probe needs is imported here.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch._inductor.codecache  # noqa: F401 - what the probe loads, imported here and not on its thread
import torch._inductor.cpp_builder  # noqa: F401
from torch._inductor import config, cpu_vec_isa

_lock = threading.Lock()
_thread: threading.Thread | None = None


def start(options: dict | None = None) -> None:
    """Start the probe on a thread of its own, once per process. ``options``: the job's Inductor
    settings, which with the calling thread's (Inductor keeps them per thread) say whether
    Inductor will use the widest instruction set that works."""
    global _thread
    with _lock:
        if _thread is None:
            widest = _widest_is_used(options or {})
            _thread = threading.Thread(
                target=_probe_vector_isas, args=(widest,), name="thunder-core-vector-isa-probe", daemon=True
            )
            _thread.start()


def wait() -> None:
    """Return once the probe has finished (starting it if nobody has)."""
    start()
    _thread.join()


def _probe_vector_isas(widest_is_used: bool) -> None:
    """Probe the CPU's vector ISAs, which Inductor does once per process before its first compile.

    Inductor builds and loads a test library for every vector ISA the CPU's flags name (about two
    seconds each on a 2-core x86, four of them on a CPU with AMX), one after the other, and then
    uses the widest that works, unless ``ATEN_CPU_CAPABILITY`` or ``cpp.simdlen`` asks for
    another. So when neither does (``widest_is_used``), the widest is probed first, and when it
    works Inductor's list of valid ISAs is it alone for as long as nothing asks for another (the
    narrower ones are never used then). Otherwise, or when the widest fails, every candidate is
    probed, in parallel. Each result is cached, so Inductor's own ``valid_vec_isa_list()`` reuses
    them. Failures are left for the real compile to report.
    """
    try:
        flags = cpu_vec_isa.x86_isa_checker()
        candidates = [
            isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())
        ]
        probe = getattr(cpu_vec_isa.VecISA, "_probe_load", None)
        if probe is not None:
            cpu_vec_isa.VecISA._probe_load = _LoadsRemembered(probe, flags)
        try:
            if candidates and widest_is_used and candidates[0]:
                _listed_alone(candidates[0])
            else:
                with ThreadPoolExecutor(max(1, len(candidates))) as pool:
                    list(pool.map(bool, candidates))
        finally:
            if probe is not None:
                cpu_vec_isa.VecISA._probe_load = probe
        cpu_vec_isa.valid_vec_isa_list()
    except Exception:  # noqa: BLE001 - internal APIs that may change; the compile reports real problems
        pass


def _listed_alone(isa) -> None:
    """Inductor's list of valid ISAs: ``isa`` (probed) alone while nothing asks for another; when
    something does (``ATEN_CPU_CAPABILITY``, ``cpp.simdlen`` set later or on another thread),
    Inductor's own list, every candidate probed."""
    full = cpu_vec_isa.valid_vec_isa_list

    def valid_vec_isa_list() -> list:
        return [isa] if _widest_is_used({}) else full()

    valid_vec_isa_list.cache_clear = getattr(full, "cache_clear", lambda: None)
    cpu_vec_isa.valid_vec_isa_list = valid_vec_isa_list  # what pick_vec_isa() calls


def _widest_is_used(options: dict) -> bool:
    """Whether Inductor picks the widest working ISA: neither ``ATEN_CPU_CAPABILITY`` nor
    ``cpp.simdlen`` or ``cpp.vec_isa_ok`` (in ``options`` or the calling thread's config) chooses
    otherwise."""
    cpp = config.cpp
    settings = {
        "cpp.simdlen": options.get("cpp.simdlen", cpp.simdlen),
        "cpp.vec_isa_ok": options.get("cpp.vec_isa_ok", cpp.vec_isa_ok),
    }
    return not os.environ.get("ATEN_CPU_CAPABILITY") and all(v is None for v in settings.values())


class _LoadsRemembered:
    """Inductor's probe that its test library for an ISA loads (a child Python per ISA, about half
    a second each process), remembered on disk beside Inductor's cache: a library that loaded on
    this machine (its name, CPU flags, and the library's path, size and time) loads again. Only
    successes are kept; a failure is probed again next time."""

    def __init__(self, probe, flags):
        self._probe = probe
        self._machine = [platform.node(), platform.machine(), sorted(flags)]
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        self._file = os.path.join(cache_dir(), "thunder_core", "vec_isa_loads.json")
        self._lock = threading.Lock()

    def __get__(self, isa, owner=None):
        return lambda output_path: self(isa, output_path)

    def __call__(self, isa, output_path: str) -> bool:
        try:
            stat = os.stat(output_path)
            key = hashlib.sha256(
                json.dumps([*self._machine, output_path, stat.st_size, stat.st_mtime_ns]).encode()
            ).hexdigest()
        except OSError:
            return self._probe(isa, output_path)
        if key in self._read():
            return True
        loads = self._probe(isa, output_path)
        if loads:
            self._add(key)
        return loads

    def _read(self) -> list:
        try:
            with open(self._file) as f:
                known = json.load(f)
            return known if isinstance(known, list) else []
        except (OSError, ValueError):
            return []

    def _add(self, key: str) -> None:
        with self._lock:
            try:
                os.makedirs(os.path.dirname(self._file), exist_ok=True)
                known = [*self._read(), key][-64:]
                fd, temporary = tempfile.mkstemp(dir=os.path.dirname(self._file), prefix=".tmp-")
                with os.fdopen(fd, "w") as f:
                    json.dump(known, f)
                os.replace(temporary, self._file)  # whole or not at all, for other processes too
            except OSError:
                pass
