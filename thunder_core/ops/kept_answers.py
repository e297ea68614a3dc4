"""Answers about metadata kept on disk, for later processes.

Capture asks PyTorch two kinds of questions whose answers depend only on the question and the
versions of torch and thunder-core: what an operation returns (``thunder_core.capture.meta``
runs it on meta tensors) and which dtypes elementwise type promotion picks
(``thunder_core.ops._helpers.promote``). Both are memoized per process, but many of PyTorch's
meta kernels and its type promotion import sympy on first use (about 0.2 s), so a new process
paid that on its first capture even for ``a + b``. Their answers are kept in the on-disk cache
(``thunder_core.disk_cache``, kind ``metadata``): one entry per version set, read once per
process, merged and rewritten after a compile that learned something new. A question is text
that names everything the answer depends on (the caller builds it; operations by their public
torch path); an answer holds only tensors' metadata (``TensorSpec``), numbers, strings, dtypes,
devices, ``torch.Size``, tuples and lists.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from thunder_core.disk_cache import DiskCache, digest, open_disk_cache
from thunder_core.ops.registry import torch_path

ENTRY_LIMIT = 20_000  # answers kept per version set; past it new ones stay in memory only


class NotKept(Exception):
    """A question or answer that cannot be kept on disk."""


class TensorSpec:
    """The metadata of an operation's tensor output: what the memo and the disk keep of it."""

    __slots__ = ("shape", "dtype", "requires_grad", "stride")

    def __init__(self, shape: torch.Size, dtype: torch.dtype, requires_grad: bool, stride: tuple):
        self.shape = shape
        self.dtype = dtype
        self.requires_grad = requires_grad
        self.stride = stride

    @classmethod
    def of(cls, y: torch.Tensor) -> TensorSpec:
        return cls(y.shape, y.dtype, y.requires_grad, y.stride())


class _Store:
    def __init__(self, disk: DiskCache, key: str):
        self.disk = disk
        self.key = key
        self.lock = threading.Lock()
        self.entries: dict[str, list] | None = None  # read on first use
        self.new: dict[str, list] = {}

    def known(self) -> dict[str, list]:
        with self.lock:
            if self.entries is None:
                body = self.disk.load(self.key)
                entries = body.get("entries") if isinstance(body, dict) else None
                self.entries = dict(entries) if isinstance(entries, dict) else {}
            return self.entries

    def add(self, text: str, answer: list) -> None:
        with self.lock:
            if len(self.new) + len(self.entries or ()) < ENTRY_LIMIT:
                self.new[text] = answer

    def flush(self) -> None:
        with self.lock:
            if not self.new:
                return
            body = self.disk.load(self.key)  # another process may have added answers meanwhile
            stored = body.get("entries") if isinstance(body, dict) else None
            entries = dict(stored) if isinstance(stored, dict) else {}
            entries.update(self.new)
            if len(entries) > ENTRY_LIMIT:
                entries = dict(list(entries.items())[-ENTRY_LIMIT:])
            self.disk.store(self.key, {"entries": entries})
            self.entries = entries
            self.new = {}


_stores: dict[tuple[str, str], _Store] = {}
_stores_lock = threading.Lock()
_current: ContextVar[_Store | None] = ContextVar("thunder_core_kept_answers", default=None)


@contextmanager
def metadata_kept_in(directory: str | None, versions: dict):
    """Questions asked inside the block read and add answers kept under ``directory``
    (None: memory only) for ``versions`` (what the answers depend on besides the question)."""
    store = None
    if directory is not None:
        disk = open_disk_cache(directory, "metadata")
        if disk is not None:
            key = digest(versions)
            with _stores_lock:
                store = _stores.setdefault((directory, key), _Store(disk, key))
    token = _current.set(store)
    try:
        yield
    finally:
        _current.reset(token)
        if store is not None:
            try:
                store.flush()
            except Exception:  # noqa: BLE001 - a cache that cannot be written is only slower
                pass


def function_name(fn) -> str:
    """``fn`` named the same in every process with these versions: its public torch path, or
    ``module:qualname`` for a module-level function of thunder-core (whose sources are part of
    the versions); NotKept for anything else."""
    path = torch_path(fn)
    if path is not None:
        return path
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not module.startswith("thunder_core.") or not isinstance(qualname, str):
        raise NotKept
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not fn:
        raise NotKept
    return f"{module}:{qualname}"


def lookup(question: str):
    """The kept answer to ``question``, or None (nothing kept, or kept by no process yet)."""
    store = _current.get()
    if store is None:
        return None
    try:
        answer = store.known().get(question)
        return None if answer is None else _decode(answer)
    except Exception:  # noqa: BLE001 - an entry this version cannot read: ask PyTorch again
        return None


def remember(question: str, answer) -> None:
    """Keep ``answer`` to ``question`` for later processes, if it can be described."""
    store = _current.get()
    if store is None:
        return
    try:
        store.add(question, _encode(answer))
    except NotKept:
        pass


def _encode(x) -> list:
    kind = type(x)
    if kind is TensorSpec:
        return ["tensor", list(x.shape), str(x.dtype), x.requires_grad, list(x.stride)]
    if kind is torch.Size:
        return ["size", list(x)]
    if kind in (tuple, list):
        return [kind.__name__, [_encode(y) for y in x]]
    if kind in (bool, int, str) or x is None:
        return [kind.__name__, x]
    if kind is float:
        return ["float", repr(x)]
    if kind is torch.dtype:
        return ["dtype", str(x)]
    if kind is torch.device:
        return ["device", str(x)]
    raise NotKept


def _dtype(text: str) -> torch.dtype:
    dtype = getattr(torch, text.removeprefix("torch."))
    if not isinstance(dtype, torch.dtype):
        raise NotKept
    return dtype


def _decode(data: list):
    kind, value = data[0], data[1]
    if kind == "tensor":
        shape, dtype, requires_grad, stride = data[1:]
        return TensorSpec(torch.Size(shape), _dtype(dtype), bool(requires_grad), tuple(stride))
    if kind == "size":
        return torch.Size(value)
    if kind == "tuple":
        return tuple(_decode(y) for y in value)
    if kind == "list":
        return [_decode(y) for y in value]
    if kind == "float":
        return float(value)
    if kind == "dtype":
        return _dtype(value)
    if kind == "device":
        return torch.device(value)
    if kind in ("bool", "int", "str", "NoneType"):
        return value
    raise NotKept
