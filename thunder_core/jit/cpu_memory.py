"""Keeping freed CPU memory for reuse, so a program's intermediates do not page-fault each call.

PyTorch allocates CPU tensors with the C library's ``malloc``. glibc gives large freed blocks
back to the operating system: blocks above ``M_MMAP_THRESHOLD`` are unmapped when freed, and
free space above ``M_TRIM_THRESHOLD`` at the top of the heap is trimmed (both thresholds
adapt to the sizes seen, up to 32 MiB). The next allocation of that memory maps fresh pages,
and the kernel faults in and zeroes every 4 KiB page on its first write. A compiled training
step allocates and frees the same tens of megabytes every step, so it can spend a large part
of its time in page faults (measured in ``docs/performance.md``).

With ``cpu_memory = "keep"`` (the default) compiling the first program that takes CPU
tensors sets glibc's thresholds once for the process: blocks up to 32 MiB come from the heap,
and freed heap memory is kept for the next allocations instead of being trimmed. The
process's resident memory then stays at its peak, as a GPU caching allocator's does; nothing
else changes. ``"release"`` (``THUNDER_CORE_CPU_MEMORY=release``) leaves malloc as it is.
Settings the user made for glibc's malloc (``MALLOC_*_`` variables, ``GLIBC_TUNABLES``) are
never overridden, and on other C libraries nothing is done (a malloc preloaded in glibc's
place, such as jemalloc, ignores the thresholds).
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = -1  # as size_t, the largest value: free heap memory is never handed back by trimming
_USER_SETTINGS = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)

_lock = threading.Lock()
_outcome: str | None = None


def user_malloc_settings() -> str | None:
    """The environment variable through which the user configured glibc's malloc, if any."""
    for name in _USER_SETTINGS:
        if name in os.environ:
            return name
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def keep_freed_memory() -> str:
    """Apply the "keep" policy once per process; returns what was done, for ``explain``."""
    global _outcome
    with _lock:
        if _outcome is None:
            _outcome = _apply()
        return _outcome


def _apply() -> str:
    user = user_malloc_settings()
    if user is not None:
        return f"cpu memory: malloc left as {user} configures it"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "cpu memory: left to the C library (the keep policy is for glibc's malloc)"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError) as error:
        return f"cpu memory: left to the C library (mallopt unavailable: {error})"
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return "cpu memory: left to the C library (glibc refused the mmap threshold)"
    if mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "cpu memory: blocks up to 32 MiB come from the heap; glibc refused the trim threshold"
    return (
        "cpu memory: freed blocks up to 32 MiB are kept for reuse, not returned to the OS "
        "(glibc malloc thresholds; THUNDER_CORE_CPU_MEMORY=release leaves malloc as it is)"
    )
