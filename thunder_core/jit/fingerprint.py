"""Process-independent descriptions of what a compiled program was specialized on.

The on-disk cache (``thunder_core.disk_cache``) may only use an entry in another process
when everything the entry depended on is provably the same there. Identities (``id()``) mean
nothing across processes, so each guard check and each part of the cache key is described by
value instead: Python literals by their ``repr``, dtypes and devices by name, classes and
functions by their module and qualified name (their code by the hash of the files that
ran, ``file_hashes``), modules of the tree by class, any other object by its type and the order
in which the guard walk first reached it (so which paths share an object is compared too).
Whatever cannot be described so raises ``NotPersistable``.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import logging
import math
import os
import sys
import types

import torch

from thunder_core.jit.guards import MISSING
from thunder_core.jit.trace_data import NotPersistable

_NAMED_TYPES = (torch.dtype, torch.device, torch.memory_format, torch.layout)


def qualified_name(obj) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def stable_value(x):
    """``x`` as JSON data equal in every process exactly when the values are equal; raises
    ``NotPersistable`` for anything else."""
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is float:
        return {"float": repr(x)} if not math.isfinite(x) or x == 0.0 else x
    if type(x) is complex:
        return {"complex": repr(x)}
    if type(x) is bytes:
        return {"bytes": hashlib.sha256(x).hexdigest()}
    if isinstance(x, _NAMED_TYPES):
        return {type(x).__name__: str(x)}
    if isinstance(x, (tuple, list)) and type(x) in (tuple, list, torch.Size):
        return {type(x).__name__: [stable_value(item) for item in x]}
    if type(x) is frozenset or type(x) is set:
        return {"set": sorted(json.dumps(stable_value(item)) for item in x)}
    if type(x) is range:
        return {"range": [x.start, x.stop, x.step]}
    if type(x) is slice:
        return {"slice": [stable_value(x.start), stable_value(x.stop), stable_value(x.step)]}
    if x is Ellipsis:
        return {"ellipsis": True}
    if isinstance(x, enum.Enum):
        return {"enum": qualified_name(type(x)), "name": x.name}
    if isinstance(x, type):
        return {"class": qualified_name(x)}
    if isinstance(x, types.ModuleType):
        return {"module": x.__name__}
    if isinstance(x, (types.FunctionType, types.BuiltinFunctionType)):
        return {"function": qualified_name(x)}
    raise NotPersistable(f"a {type(x).__qualname__} value cannot be compared across processes")


def _object_identity(obj, name: str):
    """A guard's ``is`` check, across processes: what the object is by name where it has one,
    else its type and where the walk first found it (its contents are guarded by other checks)."""
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, enum.Enum)):
        return stable_value(obj)
    if isinstance(obj, (staticmethod, classmethod)):
        return {"descriptor": type(obj).__name__, "of": _object_identity(obj.__func__, name)}
    if isinstance(obj, property):
        return {
            "property": [None if f is None else qualified_name(f) for f in (obj.fget, obj.fset, obj.fdel)]
        }
    if isinstance(obj, logging.Logger):  # logging.getLogger(name) is one object per name
        return {"logger": obj.name}
    from thunder_core.capture.reads import OPAQUE_MODULES

    if type(obj).__module__.split(".")[0] in OPAQUE_MODULES or isinstance(obj, torch.Generator):
        raise NotPersistable(f"the program depends on the identity of a {type(obj).__qualname__} object")
    return {"object": qualified_name(type(obj)), "first_found_as": name}


def guard_tokens(tokens: list) -> list:
    """``GuardBuilder.tokens`` as JSON data comparable across processes."""
    out = []
    for token in tokens:
        kind, what = token[0], token[1]
        if kind == "value":
            expected = {"absent": True} if token[3] is MISSING else stable_value(token[3])
            out.append(["value", what, qualified_name(token[2]), expected])
        elif kind == "module":
            out.append(["module", what, qualified_name(token[2]), token[3]])
        elif kind == "is":
            out.append(["is", what, _object_identity(token[3], token[4])])
        elif kind == "array":
            out.append(["array", what, token[2], list(token[3]), hashlib.sha256(token[4]).hexdigest()])
        else:
            raise NotPersistable(f"a guard of kind {kind!r}")
    return out


def code_fingerprint(fn) -> str:
    """A hash of a function's code (its bytecode, names and constants, nested code included)."""
    digest = hashlib.sha256()

    def add(code: types.CodeType) -> None:
        digest.update(code.co_code)
        digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_firstlineno)).encode())
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add(const)
            else:
                digest.update(repr(const).encode())

    code = getattr(fn, "__code__", None)
    if code is None:
        raise NotPersistable(f"{type(fn).__qualname__} has no Python code to fingerprint")
    add(code)
    return digest.hexdigest()


@functools.lru_cache(maxsize=4096)
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def file_hashes(paths) -> dict[str, str]:
    """``{path: sha256 of its content}`` of the source files of code that ran; raises
    ``NotPersistable`` for code without a file (``exec``'d strings, some notebooks)."""
    out = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            raise NotPersistable(f"code from {path!r}, which is not a file") from None
        out[path] = _file_hash(path, st.st_mtime_ns, st.st_size)
    return out


def files_changed(stored: dict[str, str]) -> str | None:
    """The first of ``stored``'s files whose content is no longer what it was, or None."""
    for path, digest in stored.items():
        try:
            now = file_hashes([path])[path]
        except NotPersistable:
            return path
        if now != digest:
            return path
    return None


def ambient_torch_state() -> str:
    """Grad mode, autocast, default dtype, determinism and TF32 flags, threads: PyTorch's own
    description of its global state (what Dynamo's guards check)."""
    try:
        from torch._C._dynamo.guards import GlobalStateGuard

        return GlobalStateGuard().__getstate__()
    except Exception:  # noqa: BLE001 - a torch without it
        return repr(
            (
                torch.is_grad_enabled(),
                torch.get_default_dtype(),
                torch.is_autocast_enabled("cpu"),
                torch.are_deterministic_algorithms_enabled(),
                torch.get_num_threads(),
            )
        )


def environment() -> dict:
    """The versions a stored trace depends on."""
    from thunder_core._version import __version__

    return {
        "thunder_core": __version__,
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "python": list(sys.version_info[:3]),
        "implementation": sys.implementation.name,
    }
