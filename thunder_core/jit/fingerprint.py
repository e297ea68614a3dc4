"""Process-independent descriptions of what a compiled program was specialized on.

The on-disk cache (``thunder_core.disk_cache``) may only use an entry in another process
when everything the entry depended on is provably the same there. Identities (``id()``) mean
nothing across processes, so each guard check and each part of the cache key is described by
value instead: Python literals by their ``repr``, dtypes and devices by name, classes and
functions by their module and qualified name, modules of the tree by class, any other object by
its type and the order in which the guard walk first reached it (so which paths share an object
is compared too; an object whose state the walk cannot see is refused). The code that ran is
compared by a hash of each code object, found again in the loaded modules by module and
qualified name (``code_identity``): another checkout, an edited file or an upgraded library is
other code. Whatever cannot be described so raises ``NotPersistable``.
"""

from __future__ import annotations

import contextvars
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
from thunder_core.jit.trace_data import NotPersistable, trace_to_data

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
        return {"enum": qualified_name(type(x)), "name": x.name, "value": stable_value(x.value)}
    if isinstance(x, type):
        return {"class": qualified_name(x)}
    if isinstance(x, types.ModuleType):
        return {"module": x.__name__}
    if isinstance(x, types.FunctionType):
        return function_identity(x)
    if isinstance(x, types.BuiltinFunctionType):
        return {"function": qualified_name(x)}
    raise NotPersistable(f"a {type(x).__qualname__} value cannot be compared across processes")


def function_identity(fn: types.FunctionType, depth: int = 0) -> dict:
    """A Python function by name, code, defaults, closure values and attributes (a method's
    ``temperature=0.7``, a decorator's closure, ``act.scale = 2``), what it wraps included."""
    if depth > 8:
        raise NotPersistable(f"{qualified_name(fn)} wraps functions too deeply")
    described = {"function": qualified_name(fn), "code": _code_hash(fn.__code__)}
    if fn.__defaults__:
        described["defaults"] = stable_value(fn.__defaults__)
    if fn.__kwdefaults__:
        described["kwdefaults"] = stable_value(sorted(fn.__kwdefaults__.items()))
    cells = []
    for cell_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        if cell_name == "__class__":
            continue
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(content, types.FunctionType):
            cells.append([cell_name, function_identity(content, depth + 1)])
        else:
            cells.append([cell_name, stable_value(content)])
    if cells:
        described["closure"] = cells
    attributes = {k: v for k, v in vars(fn).items() if k not in _FUNCTION_METADATA}
    if attributes:
        described["attributes"] = stable_value(sorted(attributes.items()))
    wrapped = getattr(fn, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType):
        described["wraps"] = function_identity(wrapped, depth + 1)
    return described


# What functools.wraps and the language put on a function: not state of the program's own.
_FUNCTION_METADATA = frozenset(
    {"__wrapped__", "__doc__", "__name__", "__qualname__", "__module__", "__dict__"}
)


def _object_identity(obj, name: str):
    """A guard's ``is`` check, across processes: what the object is by name where it has one,
    else its type and where the walk first found it (its contents are guarded by other checks;
    an object whose state the walk cannot see is refused)."""
    if isinstance(obj, _DESCRIPTORS):  # object.__init__, str.join: a C function of a class
        return {"descriptor": qualified_name(obj.__objclass__), "name": obj.__name__}
    if isinstance(obj, types.BuiltinFunctionType) and isinstance(obj.__self__, type):  # dict.fromkeys
        return {"builtin": qualified_name(obj.__self__), "name": obj.__name__}
    if isinstance(obj, types.BuiltinFunctionType) and not isinstance(
        getattr(obj, "__self__", None), (types.ModuleType, type(None))
    ):  # a bound method of an object (TABLE.get): that object's state is not guarded
        raise NotPersistable(f"the program depends on a bound method of a {type(obj.__self__).__qualname__}")
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, enum.Enum)):
        return stable_value(obj)
    if isinstance(obj, (staticmethod, classmethod)):
        return {"descriptor": type(obj).__name__, "of": _object_identity(obj.__func__, name)}
    if isinstance(obj, property):
        return {
            "property": [
                None if f is None else _object_identity(f, name) for f in (obj.fget, obj.fset, obj.fdel)
            ]
        }
    if isinstance(obj, logging.Logger):  # logging.getLogger(name) is one object per name
        return {"logger": obj.name}
    if isinstance(obj, contextvars.ContextVar):  # its value now, in this thread's context
        return {"contextvar": obj.name, "value": stable_value(obj.get(None)), "first_found_as": name}
    from thunder_core.capture.reads import OPAQUE_MODULES

    if type(obj).__module__.split(".")[0] in OPAQUE_MODULES or isinstance(obj, torch.Generator):
        raise NotPersistable(f"the program depends on the identity of a {type(obj).__qualname__} object")
    walked = (
        isinstance(obj, _WALKED) or isinstance(getattr(obj, "__dict__", None), dict) or _has_slots(type(obj))
    )
    # An ABC's registry (``_abc_impl``, one per class) goes with its class; explicit
    # ``ABC.register`` calls are not compared.
    walked = walked or type(obj).__qualname__ == "_abc_data"
    if not walked and not _is_array(obj):  # a C object (operator.itemgetter, re.Pattern): state unseen
        raise NotPersistable(f"the program depends on a {type(obj).__qualname__} whose state is not guarded")
    return {"object": qualified_name(type(obj)), "first_found_as": name}


# Objects whose contents the guard walk checks (``GuardBuilder.contents``) besides those with
# attributes of their own.
_WALKED = (dict, list, tuple, set, frozenset, functools.partial, types.MethodType)


_DESCRIPTORS = (types.WrapperDescriptorType, types.MethodDescriptorType, types.ClassMethodDescriptorType)


def _has_slots(cls) -> bool:
    return any(klass.__dict__.get("__slots__") for klass in cls.__mro__ if klass is not object)


def _is_array(obj) -> bool:
    return type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray"  # guarded by value


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
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        raise NotPersistable(f"{type(fn).__qualname__} has no Python code to fingerprint")
    return _code_hash(code)


def code_identity(module_name: str, code: types.CodeType) -> list:
    """Where a code object that ran can be found again (its module and the attribute path to
    its function) and a hash of it; raises ``NotPersistable`` if it cannot be found again."""
    path = code.co_qualname
    if resolve_code(module_name, path, code.co_qualname, code.co_firstlineno) is not code:
        path = _generated_path(sys.modules.get(module_name), code)  # a dataclass's __init__, say
        if path is None or resolve_code(module_name, path, code.co_qualname, code.co_firstlineno) is not code:
            raise NotPersistable(f"{code.co_qualname} ({module_name}) cannot be found again by its name")
    return [module_name, path, code.co_qualname, code.co_firstlineno, _code_hash(code)]


def code_changed(stored: list) -> str | None:
    """The first stored ``code_identity`` whose code in this process differs, or None."""
    for module_name, path, qualname, firstlineno, digest in stored:
        code = resolve_code(module_name, path, qualname, firstlineno)
        if code is None or _code_hash(code) != digest:
            return f"{path} ({module_name})"
    return None


def resolve_code(module_name: str, path: str, qualname: str, firstlineno: int) -> types.CodeType | None:
    """The code object ``qualname`` found along ``path`` in the loaded module ``module_name``:
    through attributes (classes, functions, the functions decorators wrap), then through the
    nested code of a function (``f.<locals>.g``, comprehensions, lambdas: by name and line)."""
    obj = sys.modules.get(module_name)
    parts = path.split(".")
    for position, part in enumerate(parts):
        if part == "<locals>":
            code = _code_of(obj)
            return _nested(code, parts[position + 1 :], firstlineno) if code is not None else None
        obj = _attribute(obj, part)
        if obj is None:
            return None
    while obj is not None:  # functools.wraps: the wrapper carries the wrapped function's name
        code = _code_of(obj)
        if code is not None and code.co_qualname == qualname:
            return code
        obj = getattr(obj, "__wrapped__", None)
    return None


def _generated_path(module, code: types.CodeType) -> str | None:
    """``Class.name`` of the method of a class of ``module`` whose code is ``code`` (code
    generated at class creation, such as a dataclass's ``__init__``, has no name of its own)."""
    for cls_name, cls in vars(module).items() if module is not None else ():
        if isinstance(cls, type) and cls.__module__ == module.__name__:
            for name, member in vars(cls).items():
                if _code_of(member) is code:
                    return f"{cls_name}.{name}"
    return None


def _attribute(obj, name: str):
    if obj is None:
        return None
    found = (vars(obj) if isinstance(obj, (type, types.ModuleType)) else {}).get(name, MISSING)
    if found is MISSING:
        found = getattr(obj, name, None)
    if isinstance(found, (staticmethod, classmethod)):
        return found.__func__
    if isinstance(found, property):
        return found.fget
    return found


def _code_of(obj) -> types.CodeType | None:
    return getattr(getattr(obj, "__func__", obj), "__code__", None)


def _nested(code: types.CodeType, parts: list[str], firstlineno: int) -> types.CodeType | None:
    for position, part in enumerate(parts):
        if part == "<locals>":
            continue
        last = position == len(parts) - 1
        found = [
            c for c in code.co_consts
            if isinstance(c, types.CodeType) and c.co_name == part and (not last or c.co_firstlineno == firstlineno)
        ]  # fmt: skip
        if len(found) != 1:
            return None
        code = found[0]
    return code


def _code_hash(code: types.CodeType) -> str:
    digest = hashlib.sha256()
    _add_code(digest, code)
    return digest.hexdigest()


def _add_code(digest, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_firstlineno)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _add_code(digest, const)
        else:
            digest.update(repr(const).encode())


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
    """The versions a stored trace depends on (thunder-core's own sources by hash: a development
    checkout changes without its version), and the process's place in a distributed job."""
    distributed = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        distributed = [torch.distributed.get_rank(), torch.distributed.get_world_size()]
    return {**versions(), "distributed": distributed}


def versions() -> dict:
    """The versions of thunder-core (its sources by hash: a development checkout changes without
    its version), torch and Python."""
    from thunder_core._version import __version__

    return {
        "thunder_core": __version__,
        "thunder_core_sources": _core_sources_hash(),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "python": list(sys.version_info[:3]),
        "implementation": sys.implementation.name,
    }


@functools.cache
def _core_sources_hash() -> str:
    """Each source file's path, size and modification time (as Python's own bytecode cache
    tells a changed source: reading and hashing them all cost a first call 12 ms)."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    digest = hashlib.sha256()
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                found = os.stat(os.path.join(folder, name))
                where = os.path.relpath(os.path.join(folder, name), root)
                digest.update(f"{where}\0{found.st_size}\0{found.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def region_fingerprint(region) -> str | None:
    """A digest of what a fusion region computes, the same in every process: its operations, its
    inputs' and outputs' metadata, the versions of thunder-core, torch and Python, and PyTorch's
    global state (grad mode, default dtype, determinism, TF32, threads). None when part of it
    cannot be written down exactly (an opaque callable, a real tensor constant, symbolic sizes).
    Executors key what they keep on disk for a region by it (``job_disk_cache``)."""
    from thunder_core.disk_cache import digest

    try:
        data = trace_to_data(region.as_trace("region"), claimed=True)
    except NotPersistable:
        return None
    return digest({"region": data, "versions": versions(), "torch_state": ambient_torch_state()})
