"""Dict versions (PEP 509, CPython before 3.12): what lets a guard skip the checks of dicts that
were not written to since they last held (``thunder_core.jit.guards``).

``dict_version`` is PyTorch's reader of a dict's version, or None where versions cannot be
trusted. ``install_version_checks`` gives a guard's generated code its ``_hold()``: the
versions compared from Python, and after ``NATIVE_AFTER_CALLS`` calls in a row that held,
by PyTorch's own C++ guard manager.
"""

from __future__ import annotations

import functools
import gc
import sys


def _working_dict_versions():
    """PyTorch's ``dict_version`` when it reads a version that every write to a dict changes
    (CPython before 3.12, PEP 509), else None: the guards then run every check on every call."""
    if sys.version_info >= (3, 12):
        return None
    try:
        from torch._C._dynamo.guards import dict_version
    except ImportError:  # pragma: no cover - every supported torch has it
        return None

    class Probe:
        pass

    probe, table = Probe(), {}
    try:
        attributes = vars(probe)
        seen = [dict_version(table)]
        table["a"] = 1
        seen.append(dict_version(table))
        table["a"] = 2
        seen.append(dict_version(table))
        del table["a"]
        seen.append(dict_version(table))
        probe.x = 1
        seen.append(dict_version(attributes))
        probe.x = 2
        seen.append(dict_version(attributes))
        unchanged = dict_version(table) == seen[3] and dict_version(attributes) == seen[5]
    except Exception:  # noqa: BLE001 - an internal API: without it every check runs
        return None
    return dict_version if unchanged and len(set(seen)) == len(seen) else None


dict_version = _working_dict_versions()

# Consecutive calls whose dict versions held before the versions are checked by PyTorch's C++
# guard manager (``_native_versions_check``) instead of read one by one in Python.
NATIVE_AFTER_CALLS = 16


def _native_versions_check(dicts: tuple):
    """A no-argument callable that is True while none of ``dicts`` was written to since now,
    checked by PyTorch's own C++ guard manager (Dynamo's ``DICT_VERSION`` guards: a few
    nanoseconds per dict against some 40 read from Python); None where that is not available.

    Only once ``torch._dynamo`` is imported (its guard managers need it: a job of the torch
    executor alone never imports it), and only after a check of the result agrees with the
    dicts as they are.
    """
    if "torch._dynamo" not in sys.modules or dict_version is None:
        return None
    try:
        from torch._C._dynamo.guards import RootGuardManager
        from torch._dynamo.guards import GuardManagerType

        root = RootGuardManager()
        for i, table in enumerate(dicts):
            manager = root.tuple_getitem_manager(i, f"dicts[{i}]", table, GuardManagerType.GUARD_MANAGER)
            try:
                manager.add_dict_version_guard(table, [f"dict_version(dicts[{i}])"], None)
            except TypeError:  # torch before the guard's user_stack argument
                manager.add_dict_version_guard(table, [f"dict_version(dicts[{i}])"])
        if root.check(dicts) is not True:
            return None
    except Exception:  # noqa: BLE001 - an internal API: the versions are read from Python instead
        return None
    return functools.partial(root.check, dicts)


def install_version_checks(namespace: dict) -> None:
    """``_hold()`` in a guard's namespace: True while the versions its checks depend on are
    those recorded by the last ``_full_check`` (``_reset_hold``); read from Python, and after
    ``NATIVE_AFTER_CALLS`` calls in a row that held, by ``_native_versions_check``."""
    version, dicts = namespace["_version"], namespace["_dicts"]
    streak = [0]

    def python_hold() -> bool:
        if tuple(map(version, dicts)) != namespace["_versions"]:
            return False
        streak[0] += 1
        if streak[0] == NATIVE_AFTER_CALLS:
            native = _native_versions_check(dicts)
            # Versions only grow: the same ones after the build mean it recorded the checked state.
            if native is not None and tuple(map(version, dicts)) == namespace["_versions"]:
                namespace["_hold"] = native
        return True

    def reset_hold() -> None:
        streak[0] = 0
        namespace["_hold"] = python_hold

    namespace["_hold"] = python_hold
    namespace["_reset_hold"] = reset_hold


def class_table(cls: type):
    """The dict behind ``cls.__dict__`` (a read-only proxy of it), whose version changes with every
    ``cls.attr = ...``; the proxy itself where it cannot be found."""
    proxy = cls.__dict__
    if dict_version is not None:
        referents = [r for r in gc.get_referents(proxy) if type(r) is dict]
        if len(referents) == 1 and referents[0] == proxy:
            return referents[0]
    return proxy
