"""The on-disk cache's files: one JSON document per entry, written atomically, checked on read.

Used for captured traces (``thunder_core.jit.persistent``), for the executor choices that
were measured (``thunder_core.executors.selection``), and by executors for what they keep
themselves (``job_disk_cache``: the Inductor executor's compiled regions).

The directory is the user's own: it is created private (``0o700``) and one that another user
owns or that others can write to is refused with a warning (an entry is code that will run).
Each entry is written to a temporary file in the same directory and moved into place with
``os.replace``, so a reader (another rank of a ``torchrun`` job, another process) sees either
no entry or a whole one, and two writers of the same entry leave one of their two whole
documents. Every document is a header line holding the SHA-256 of the JSON body that follows; one that does not parse, does not
match its hash or has another format is ignored with one warning per process. Nothing is
unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

FORMAT = 1
ENV = "THUNDER_CORE_CACHE_DIR"
_opened: dict[tuple[str, str], DiskCache | None] = {}
_warned: set[str] = set()
_lock = threading.Lock()  # the caches opened
_warn_lock = threading.Lock()
_job_directory: ContextVar[str | None] = ContextVar("thunder_core_cache_directory", default=None)


class _DefaultCacheDir:
    """``jit(cache_dir=...)`` not given: the environment, the config file, then the user's cache
    directory (``thunder_core.plugins.config``). One object (pickled by name), so that no path
    string is taken for it."""

    def __repr__(self) -> str:
        return "DEFAULT_CACHE_DIR"

    def __reduce__(self) -> str:
        return "DEFAULT_CACHE_DIR"


DEFAULT_CACHE_DIR = _DefaultCacheDir()


def open_disk_cache(directory: str, kind: str) -> DiskCache | None:
    """The cache of ``kind`` in ``directory``, opened once per process (None: unusable, warned once)."""
    with _lock:
        if (directory, kind) not in _opened:
            _opened[directory, kind] = DiskCache.open(directory, kind)
        return _opened[directory, kind]


@contextmanager
def job_cache_directory(directory: str | None) -> Iterator[None]:
    """Compiles inside the block keep what they may keep on disk under ``directory`` (None:
    nothing on disk): the job's ``cache_dir``."""
    token = _job_directory.set(directory)
    try:
        yield
    finally:
        _job_directory.reset(token)


def job_disk_cache(kind: str) -> DiskCache | None:
    """The on-disk cache of ``kind`` for the job compiling on this thread; None when the job
    keeps nothing on disk (``cache_dir=None``) or its directory is unusable (warned once).
    Executors keep their own entries under a kind of their own (``"inductor-regions"``)."""
    directory = _job_directory.get()
    return open_disk_cache(directory, kind) if directory is not None else None


def _warn_once(what: str, message: str) -> None:
    with _warn_lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(f"thunder_core: {message}", stacklevel=4)


def digest(material) -> str:
    """The hex SHA-256 of JSON ``material`` (keys sorted): an entry's file name."""
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


class DiskCache:
    """Entries of one kind (``traces``, ``decisions``) under ``directory/<kind>-v<format>``, each
    named by the digest of what it is keyed on."""

    def __init__(self, directory: str, kind: str):
        root = os.path.abspath(os.path.expanduser(directory))
        self.directory = os.path.join(root, f"{kind}-v{FORMAT}")

    @classmethod
    def open(cls, directory: str, kind: str) -> DiskCache | None:
        """The cache in ``directory`` (created private if missing), or None, with a warning, if it
        cannot be made or is not safe to run code from."""
        cache = cls(directory, kind)
        try:
            os.makedirs(os.path.dirname(cache.directory), mode=0o700, exist_ok=True)  # the root: private too
            os.makedirs(cache.directory, mode=0o700, exist_ok=True)
            for path in (os.path.dirname(cache.directory), cache.directory):
                st = os.stat(path)
                if hasattr(os, "getuid") and st.st_uid != os.getuid():
                    problem = "belongs to another user"
                elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    problem = "can be written by other users"
                else:
                    continue
                _warn_once(
                    f"unsafe {path}",
                    f"the compile cache directory {path} {problem}, so its entries cannot be trusted; "
                    f"the disk cache is off. Use a private directory (chmod 700 {path}), point "
                    f"{ENV} at one, or pass cache_dir=None to jit.",
                )
                return None
        except OSError as error:
            _warn_once(
                f"unusable {directory}",
                f"the compile cache directory {directory} cannot be used ({error}); the disk cache is off. "
                f"Point {ENV} at a writable directory, or pass cache_dir=None to jit.",
            )
            return None
        cache._remove_abandoned_writes()
        return cache

    def _remove_abandoned_writes(self) -> None:
        """Temporary files older than an hour: writes of processes that were killed midway."""
        limit = time.time() - 3600
        try:
            for entry in os.scandir(self.directory):
                if entry.name.startswith(".tmp-") and entry.stat().st_mtime < limit:
                    os.unlink(entry.path)
        except OSError:
            pass

    def path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.json")

    def load(self, key: str) -> dict | None:
        """The body stored under ``key``; None if there is none or it is damaged (warned once)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            _warn_once(path, f"ignoring the compile cache entry {path}: {error}")
            return None
        header, _, text = raw.partition(b"\n")
        try:
            document = json.loads(header)
            intact = document["format"] == FORMAT and document["sha256"] == hashlib.sha256(text).hexdigest()
            body = json.loads(text) if intact else None
        except (ValueError, KeyError, TypeError):
            intact = False
        if not intact:
            _warn_once(
                path,
                f"ignoring the damaged or foreign compile cache entry {path} (it does not match its own "
                "hash); it is compiled again and replaced",
            )
            return None
        return body

    def store(self, key: str, body: dict) -> None:
        """Write ``body`` under ``key`` atomically (readers see the old entry or the new one)."""
        text = json.dumps(body, separators=(",", ":")).encode()
        header = json.dumps({"format": FORMAT, "sha256": hashlib.sha256(text).hexdigest()}).encode()
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header + b"\n" + text)
            os.replace(temporary, self.path(key))
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
