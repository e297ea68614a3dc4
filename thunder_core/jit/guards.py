"""Guards: the Python state a compiled trace was specialized on, checked before each cached call.

Capture runs the user's Python once and bakes every Python value it reads into the trace:
globals, closure variables, function defaults, attributes of modules and of plain objects
(configs, dataclasses), the module tree and its hooks, and ambient torch state. Before the
capture, ``GuardBuilder`` walks what the program can reach from those roots and records, for
each value, a check:

- immutable values (numbers, strings, None, dtypes, devices, enums, tuples of them) must be
  equal and of the same type;
- every other object must be the same object (``is``), and its contents are walked once:
  module ``__dict__`` entries, child modules, parameter and buffer names, forward hooks;
  plain objects' ``__dict__`` or slots; lists, dicts, sets; a function's closure cells and
  defaults; a partial's function, arguments and keywords;
- real tensors must be the same object; their data is read live (they become trace inputs);
- ambient state: grad mode, autocast, default dtype, deterministic algorithms, TF32 flags
  (PyTorch's ``GlobalStateGuard``), the torch function mode stack, the default device and the
  global module hooks.

The checks compile into one generated function (``Guard.source`` shows it) that returns
``None`` when everything still holds, else ``(index, current value)`` of the first change,
which ``Guard.describe`` turns into the sentence that ``cache_info`` and warnings show.

Most checks read one entry of a dict (a module's ``__dict__``, its parameter and submodule
tables, an object's attributes, a module's globals). On CPython before 3.12 every dict carries
a version that changes with each write to it (PEP 509, read with PyTorch's ``dict_version``):
while the versions of those dicts are the ones seen when every check last held, their checks
still hold and only the others run (``_full_check`` runs them all, and records the versions,
whenever one changed). A module tree of a few thousand checks is checked in tens of
microseconds.
"""

from __future__ import annotations

import dis
import enum
import functools
import itertools
import math
import sys
import types
from typing import Any

import torch
from torch import nn

from thunder_core.capture.reads import (
    GLOBAL_MODULE_HOOKS,
    MODULE_HOOKS,
    OPAQUE_MODULES,
    generator_state,
    same_generator_state,
)
from thunder_core.errors import CaptureError
from thunder_core.jit.argument_ints import ArgumentInts
from thunder_core.jit.dict_versions import class_table, dict_version, install_version_checks
from thunder_core.jit.program_wrappers import wraps_program

MISSING = type("Missing", (), {"__repr__": lambda self: "(absent)"})()

_IMMUTABLE_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    range,
    torch.dtype,
    torch.device,
    torch.memory_format,
    torch.layout,
    type(Ellipsis),
    type(NotImplemented),
)
# nn.Module attributes that hold torch's own bookkeeping, not program behaviour.
_MODULE_INTERNALS = frozenset(
    {
        "_non_persistent_buffers_set",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
        "_is_full_backward_hook",
        "_compiled_call_impl",
    }
)
_MODULE_HOOKS = MODULE_HOOKS
# Hook tables that nn.Module reads only for the hook ids of another table (its flags of which
# forward hooks take keyword arguments, or run even when forward raises): while that table is
# empty (its own check), what they hold cannot change a call, so they are not checked, nor
# their versions read. Registering or removing a hook writes both tables.
_READ_ONLY_FOR_IDS_OF = {
    "_forward_hooks_with_kwargs": "_forward_hooks",
    "_forward_hooks_always_called": "_forward_hooks",
    "_forward_pre_hooks_with_kwargs": "_forward_pre_hooks",
}


def _unread_while_empty(key: str, attributes: dict) -> bool:
    ids_of = _READ_ONLY_FOR_IDS_OF.get(key)
    return ids_of is not None and ids_of in attributes and not attributes[ids_of]


_GLOBAL_HOOKS = GLOBAL_MODULE_HOOKS
_OPAQUE_MODULES = OPAQUE_MODULES
# Python modules whose attributes are not guarded (they do not change under a program).
_STABLE_MODULES = frozenset(sys.stdlib_module_names) | {"torch", "thunder_core", "numpy", "typing_extensions"}
MAX_CHECKS = 50_000
MAX_DEPTH = 32
MAX_ARRAY_ELEMENTS = 4096


def is_immutable(value) -> bool:
    """A value compared by equality: numbers, strings, dtypes, enums, tuples of them..."""
    if isinstance(value, _IMMUTABLE_TYPES) or isinstance(value, enum.Enum):
        return True
    if type(value) in (tuple, frozenset, torch.Size, slice):
        items = (value.start, value.stop, value.step) if type(value) is slice else value
        return all(is_immutable(item) for item in items)
    return False


class TooMuchState(CaptureError):
    """More Python state is reachable than guards can check cheaply on every call."""


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> types.CodeType:
    """Guard source compiled once per process: a re-walk of the same module tree (``rebind``, after
    ``set_kv_cache`` replaced submodules) generates the same text, bound to fresh objects."""
    return compile(source, "<thunder_core guard>", "exec")


class Guard:
    """A compiled set of checks; ``check()`` is None while every guarded value is unchanged.

    ``covers`` names, per check, the bound dicts whose unchanged versions imply that the check
    still holds (empty: the check always runs).
    """

    def __init__(
        self,
        checks: list[tuple[str, str]],
        namespace: dict[str, Any],
        descriptions: list,
        covers: list[tuple[str, ...]] | None = None,
    ):
        namespace = dict(namespace)  # its own: the generated functions keep state in it
        covers = covers if covers is not None and dict_version is not None else [()] * len(checks)
        dicts = sorted({name for names in covers for name in names})
        if dicts:
            versions = "tuple(_map(_version, _dicts))"
            namespace.update(
                _version=dict_version,
                _versions=None,
                _map=map,
                _dicts=tuple(namespace[name] for name in dicts),
            )
            install_version_checks(namespace)
            lines = ["def _full_check():", "    global _versions", f"    now = {versions}"]
            lines += _check_lines(enumerate(checks))
            lines += ["    _versions = now", "    _reset_hold()", "    return None", "def check():"]
            lines += ["    if not _hold(): return _full_check()"]
            lines += _check_lines((i, c) for i, c in enumerate(checks) if not covers[i])
        else:
            lines = ["def check():", *_check_lines(enumerate(checks))]
        self.source = "\n".join(lines) + "\n    return None\n"
        self.descriptions = descriptions
        self._checks = checks
        self._namespace = namespace
        exec(_compiled(self.source), namespace)
        self.check = namespace["check"]
        self._failures = None  # compiled when first asked for (a miss, ``cache_info``)

    def __len__(self) -> int:
        return len(self.descriptions)

    def failures(self) -> list[tuple[int, Any]]:
        """Every check that no longer holds, as ``(index, current value)``."""
        if self._failures is None:
            every = ["def failures():", "    out = []"]
            for index, (value, condition) in enumerate(self._checks):
                every += [
                    "    try:",
                    f"        v = {value}",
                    f"        if not ({condition}): out.append(({index}, v))",
                    "    except Exception as error:",
                    f"        out.append(({index}, error))",
                ]
            exec(_compiled("\n".join(every) + "\n    return out\n"), self._namespace)
            self._failures = self._namespace["failures"]
        return self._failures()

    def describe(self, failure: tuple[int, Any]) -> str:
        """What changed, for a non-None result of ``check()``."""
        index, current = failure
        what, expected = self.descriptions[index]
        return f"{what}: {_short(expected)} -> {_short(current)}"


def _check_lines(checks) -> list[str]:
    lines = []
    for index, (value, condition) in checks:
        lines += [f"    v = {value}", f"    if not ({condition}): return ({index}, v)"]
    return lines


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe_object(value) -> str:
    return f"<{type(value).__qualname__} object at {id(value):#x}>"


class GuardBuilder:
    """Walks Python state from roots and collects the checks of one ``Guard``."""

    def __init__(self):
        self._namespace: dict[str, Any] = {"MISSING": MISSING}
        self._bound: dict[int, str] = {}
        self._counter = itertools.count()
        self._checks: list[tuple[str, str]] = []
        self._covers: list[tuple[str, ...]] = []  # per check: the dicts whose versions imply it
        self._emitted: set[tuple[str, str]] = set()
        self._descriptions: list[tuple[str, Any]] = []
        self._walked: set[int] = set()
        self._classes_walked: set[int] = set()  # classes whose attributes were walked
        self._keepalive: list = []  # objects whose ids are in _bound/_walked stay alive
        self.tensor_paths: dict[int, str] = {}  # id of a real tensor -> where it was found
        self.root_state_modules: set[int] = set()  # modules whose parameters/buffers are jit inputs
        self.namespaces: list[tuple[dict, str]] = []  # attribute dicts and globals walked, for leak checks
        self.large_arrays: dict[int, tuple[str, int]] = {}  # NumPy arrays too large to compare per call
        self.arrays_read: set[int] = set()  # ids of NumPy arrays the capture turned into tensors
        # Per check, what it pins down, comparable across two walks of the same structure: a
        # submodule by its class (``rebind``), any other object by identity, values by value.
        self.tokens: list[tuple] = []
        self.random_generators: list = []  # (NumPy generator, its state when found, where)
        self.tree_checks = 0  # how many checks come from the walk of the roots (``mark_tree_walked``)
        # What capture read, replayable in another process (the on-disk cache): per user code
        # object first run, (its module's name, the global chains it loads), and the code itself.
        self.global_reads: list[tuple[str, tuple]] = []
        self.codes_run: list[tuple[str, types.CodeType]] = []  # (module name, code), each first run
        self.stable_reads: list[tuple[str, object]] = []  # values read from library modules, unguarded
        self.not_replayable: str | None = None  # why the global reads cannot be replayed elsewhere
        self.argument_ints = ArgumentInts()  # thunder_core.jit.argument_ints
        # The jitted function the guard is for, and where a wrapper of it may be installed: the
        # attribute of the module whose method was jitted (``model.forward``), ``_wrapper_of_the_program``.
        self.program: object = None
        self.program_slot: tuple[object, str] | None = None

    def argument_ints_free(self, containers: set[int]) -> None:
        """The ints of these argument containers, where the walk also meets them through the
        module, are checked for their type only if the program read them as arguments
        (``thunder_core.jit.argument_ints``)."""
        self.argument_ints.homes = containers

    def arguments_read_through_the_module(self) -> str | None:
        """After capture: the attribute through which the program may have read ints of an
        argument object that the module holds too (None if it cannot have); they must stay fixed."""
        return self.argument_ints.read_through_the_module(self.codes_run)

    # Emitting checks.
    def bind(self, obj, prefix: str = "o") -> str:
        name = self._bound.get(id(obj))
        if name is None:
            name = f"_{prefix}{next(self._counter)}"
            self._namespace[name] = obj
            self._bound[id(obj)] = name
            self._keepalive.append(obj)
        return name

    def _emit(
        self,
        value_expr: str,
        condition: str,
        what: str,
        expected,
        token: tuple | None = None,
        covered_by: tuple[str, ...] = (),
    ) -> None:
        if len(self._descriptions) >= MAX_CHECKS:
            raise TooMuchState(
                f"the program reaches more than {MAX_CHECKS} Python values (last: {what}); guarding them all "
                "would make every call slow"
            )
        if (value_expr, condition) in self._emitted:
            return
        self._emitted.add((value_expr, condition))
        self._descriptions.append((what, expected))
        self._checks.append((value_expr, condition))
        self._covers.append(covered_by)
        self.tokens.append(token if token is not None else ("value", what, type(expected), expected))

    # ``covered_by``: the bound dicts that ``expr`` reads and nothing else (see ``Guard``).
    def equal(self, expr: str, value, what: str, covered_by: tuple[str, ...] = ()) -> None:
        if value is None or type(value) is bool:
            self._emit(expr, f"v is {value!r}", what, value, covered_by=covered_by)
            return
        if _holds_float_zero(value):  # 0.0 == -0.0, yet they compute differently (1 / x, signbit)
            self._namespace["_identical"] = identical_values
            self._emit(expr, f"_identical(v, {self.bind(value, 'k')})", what, value, covered_by=covered_by)
            return
        type_name = self.bind(type(value), "T")
        if _literal(value):
            self._emit(expr, f"type(v) is {type_name} and v == {value!r}", what, value, covered_by=covered_by)
            return
        constant = self.bind(value, "k")
        condition = f"v is {constant} or (type(v) is {type_name} and v == {constant})"
        self._emit(expr, condition, what, value, covered_by=covered_by)

    def same_object(self, expr: str, value, what: str, covered_by: tuple[str, ...] = ()) -> None:
        if value is MISSING:
            self._emit(expr, "v is MISSING", what, MISSING, covered_by=covered_by)
            return
        name = self.bind(value)
        # The object and its bound name (the order it was first reached in) stay in the token for
        # the on-disk cache, which compares two walks in different processes (``fingerprint``).
        if isinstance(value, nn.Module):
            kind = ("module", what, type(value), name)
        else:
            kind = ("is", what, id(value), value, name)
        self._emit(expr, f"v is {name}", what, _describe_object(value), kind, covered_by)

    def condition(
        self, expr: str, condition: str, what: str, expected, covered_by: tuple[str, ...] = ()
    ) -> None:
        self._emit(expr, condition, what, expected, covered_by=covered_by)

    def _versioned(self, *tables) -> tuple[str, ...]:
        """The bound names of ``tables`` when every one is a plain dict (whose version changes
        with each write to it, order included), else () (the check always runs)."""
        if not all(type(t) is dict for t in tables):
            return ()
        return tuple(self.bind(t, "d") for t in tables)

    # Walking values.
    def value(self, expr: str, value, what: str, depth: int = 0, covered_by: tuple[str, ...] = ()) -> None:
        """Guard the value found at ``expr`` (source text evaluated on every check)."""
        if is_immutable(value):
            self.equal(expr, value, what, covered_by)
            return
        self.same_object(expr, value, what, covered_by)
        self.contents(value, what, depth)

    def contents(self, obj, what: str, depth: int = 0) -> None:
        """Guard what ``obj`` holds (once per object; its identity is checked where it is found)."""
        if id(obj) in self._walked:
            return
        if depth > MAX_DEPTH:
            raise TooMuchState(
                f"{what} is nested more than {MAX_DEPTH} objects deep; guards stop there, so a change below it "
                "would go unseen"
            )
        self._walked.add(id(obj))
        self._keepalive.append(obj)
        name = self.bind(obj)
        depth += 1
        if self.argument_ints.entering(obj, what):  # an argument, found outside the arguments
            try:
                self._contents(obj, name, what, depth)
            finally:
                self.argument_ints.left()
            return
        self._contents(obj, name, what, depth)

    def _contents(self, obj, name: str, what: str, depth: int) -> None:
        inner_root = getattr(type(obj), "thunder_core_guard_root", None)
        if inner_root is not None:  # a jitted function or module: what it would inline is its root
            self.contents(inner_root.__get__(obj), what, depth)
        elif isinstance(obj, torch.Tensor):
            self.tensor_paths.setdefault(id(obj), what)
        elif isinstance(obj, nn.Module):
            self._module(obj, name, what, depth)
        elif isinstance(obj, types.FunctionType):
            self._function(obj, name, what, depth)
        elif isinstance(obj, types.MethodType):
            self.contents(obj.__self__, what.rsplit(".", 1)[0], depth)
            self.contents(obj.__func__, what, depth)
        elif isinstance(obj, functools.partial):
            self.contents(obj.func, f"{what}.func", depth)
            self.value(f"{name}.args", obj.args, f"{what}.args", depth)
            self.value(f"{name}.keywords", obj.keywords, f"{what}.keywords", depth)
        elif type(obj) is list or type(obj) is tuple:
            if type(obj) is list:
                self.condition(f"len({name})", f"v == {len(obj)}", f"len({what})", len(obj))
            free = id(obj) in self.argument_ints.homes
            for i, item in enumerate(obj):
                self._item(f"{name}[{i}]", item, f"{what}[{i}]", depth, (), free)
        elif isinstance(obj, dict):
            self._dict_items(name, obj, what, depth, free_ints=id(obj) in self.argument_ints.homes)
        elif isinstance(obj, (set, frozenset)):
            if all(is_immutable(x) for x in obj):
                self.equal(f"frozenset({name})", frozenset(obj), what)
            else:  # the same members (by hash and equality: identity for plain objects), each walked
                self.condition(f"len({name})", f"v == {len(obj)}", f"len({what})", len(obj))
                for item in obj:
                    member = self.bind(item, "k")
                    where = f"a member of {what}"
                    self._emit(f"{member} in {name}", "v", where, True, ("is", where, id(item), item, member))
                    if not is_immutable(item):
                        self.contents(item, f"a member of {what}", depth)
        elif type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray":
            self._numpy_array(obj, name, what)
        elif isinstance(obj, type):
            self._class_attributes(obj, depth)  # a class used as a namespace (Config.table)
        elif isinstance(obj, (types.ModuleType, types.BuiltinFunctionType, torch.Generator)):
            pass  # the object itself is what matters; its identity is checked where it is found
        elif type(obj).__module__.startswith("numpy.random"):
            state = generator_state(obj)  # a draw from it while capturing would be frozen into the trace
            if state is not None:
                self.random_generators.append((obj, state, what))
        elif type(obj).__module__.split(".")[0] in _OPAQUE_MODULES:
            pass
        else:
            self._plain_object(obj, name, what, depth)

    def _numpy_array(self, array, name: str, what: str) -> None:
        """Small NumPy arrays are guarded by value (a copy). A larger one is noted: if the program
        turns it into a tensor (``arrays_read``), it cannot be checked cheaply (``check_arrays_read``)."""
        if array.size > MAX_ARRAY_ELEMENTS or array.dtype == object:
            self.large_arrays[id(array)] = (what, array.size)
            return
        snapshot = self.bind(array.copy(), "k")
        self._namespace["_array_equal"] = _array_equal
        self._emit(
            f"_array_equal({name}, {snapshot})", "v", f"values of {what}", "unchanged",
            ("array", what, array.dtype.str, array.shape, array.tobytes()),
        )  # fmt: skip

    def _item(self, expr: str, item, what: str, depth: int, covered: tuple, free_int: bool) -> None:
        before = len(self._checks)
        self.value(expr, item, what, depth, covered)
        if free_int and type(item) is int and len(self._checks) > before:  # argument_ints_free
            self.argument_ints.checks.append(before)

    def _dict_items(
        self, name: str, d: dict, what: str, depth: int, attributes: bool = False, free_ints: bool = False
    ) -> None:
        covered = (name,) if type(d) is dict else ()
        keys = tuple(d)
        if all(is_immutable(k) for k in keys):
            self.equal(f"tuple({name})", keys, f"keys of {what}", covered)
        else:
            self.condition(f"len({name})", f"v == {len(d)}", f"len({what})", len(d), covered)
        for key, item in d.items():
            key_expr = repr(key) if _literal(key) else self.bind(key, "k")
            where = f"{what}.{key}" if attributes else f"{what}[{key!r}]"
            self._item(f"{name}.get({key_expr}, MISSING)", item, where, depth, covered, free_ints)

    def _wrapper_of_the_program(self, module, key: str, item) -> bool:
        """Whether ``item``, found as ``module.<key>``, wraps the jitted method in the method's own
        place (``thunder_core.jit.program_wrappers``): only its identity is checked."""
        slot, program = self.program_slot, self.program
        if slot is None or slot[0] is not module or slot[1] != key or item is program:
            return False  # the jitted method installed as it is: walked as any value
        return wraps_program(item, program, MAX_DEPTH)

    def _function(self, fn: types.FunctionType, name: str, what: str, depth: int) -> None:
        for cell_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            if cell_name == "__class__":
                continue
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell (a name assigned later): nothing read yet
                continue
            cell_ref = self.bind(cell, "c")
            self.value(f"{cell_ref}.cell_contents", content, f"{cell_name} (closure of {what})", depth)
        if fn.__defaults__:
            self.value(f"{name}.__defaults__", fn.__defaults__, f"defaults of {what}", depth)
        if fn.__kwdefaults__:
            self.value(f"{name}.__kwdefaults__", fn.__kwdefaults__, f"keyword defaults of {what}", depth)

    def _plain_object(self, obj, name: str, what: str, depth: int) -> None:
        self._class_attributes(type(obj), depth)
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            d = self.bind(attributes, "d")
            self.namespaces.append((attributes, what))
            free = id(obj) in self.argument_ints.homes
            self._dict_items(d, attributes, what, depth, attributes=True, free_ints=free)
        for slot in _slots(type(obj)):
            value = getattr(obj, slot, MISSING)
            self.value(f"getattr({name}, {slot!r}, MISSING)", value, f"{what}.{slot}", depth)

    def _module(self, module: nn.Module, name: str, what: str, depth: int) -> None:
        attributes = module.__dict__
        d = self.bind(attributes, "d")
        self.namespaces.append((attributes, what))
        covered = self._versioned(attributes)
        self.condition(
            f"len({d})",
            f"v == {len(attributes)}",
            f"number of attributes of {what}",
            len(attributes),
            covered,
        )
        tables = [(key, attributes.get(key, {})) for key in ("_parameters", "_buffers", "_modules")]
        names = tuple(tuple(table) for _, table in tables)
        self.equal(
            "(" + ", ".join(f"tuple({self.bind(table, 'd')})" for _, table in tables) + ")",
            names,
            f"names of {what}'s parameters, buffers and submodules",
            self._versioned(*(table for _, table in tables)),
        )
        in_root_state = id(module) in self.root_state_modules
        for key, table in tables:
            for attr, item in table.items():
                if key == "_modules" or item is None or not in_root_state:
                    self.value(
                        f"{self.bind(table, 'd')}.get({attr!r}, MISSING)",
                        item,
                        f"{what}.{attr}",
                        depth,
                        self._versioned(table),
                    )
        empty_hooks = [
            attributes[k]
            for k in _MODULE_HOOKS
            if k in attributes and not attributes[k] and not _unread_while_empty(k, attributes)
        ]
        if empty_hooks:
            self._no_hooks(empty_hooks, f"hooks of {what}", "none")
        for key, item in attributes.items():
            if key in _MODULE_INTERNALS or key in ("_parameters", "_buffers", "_modules"):
                continue
            if key in _MODULE_HOOKS:
                if item:
                    self._dict_items(self.bind(item, "d"), item, f"{what}.{key}", depth)
            elif self._wrapper_of_the_program(module, key, item):
                self.same_object(f"{d}.get({key!r}, MISSING)", item, f"{what}.{key}", covered)
            elif key != "training" or not in_root_state:  # training of jit(module)'s tree is in the key
                self.value(f"{d}.get({key!r}, MISSING)", item, f"{what}.{key}", depth, covered)
        self._class_attributes(type(module), depth)

    def _no_hooks(self, tables: list, what: str, expected: str) -> None:
        """Hook tables (``OrderedDict``s) that are empty. Only an insertion, which changes a
        dict's version, can make one non-empty, whatever its order."""
        expr = "(" + " or ".join(self.bind(table, "d") for table in tables) + ")"
        covered = tuple(self.bind(t, "d") for t in tables) if all(isinstance(t, dict) for t in tables) else ()
        self.condition(expr, "not v", what, expected, covered)

    def _class_attributes(self, cls: type, depth: int = 0) -> None:
        """Values and methods of user classes (``Block.scale = 3``, ``Config.table = {...}`` and
        what it holds, ``Block.forward = f``)."""
        for klass in cls.__mro__:
            if klass in (nn.Module, object) or klass.__module__.split(".")[0] in _STABLE_MODULES:
                break
            if id(klass) in self._classes_walked:
                continue
            self._classes_walked.add(id(klass))
            self._keepalive.append(klass)
            table = class_table(klass)
            class_dict = self.bind(table, "d")
            covered = self._versioned(table)
            for key, item in vars(klass).items():
                if key.startswith("__") and key not in ("__call__", "__getattr__"):
                    continue
                where = f"{klass.__qualname__}.{key}"
                if isinstance(item, (types.FunctionType, staticmethod, classmethod, property)):
                    self.same_object(f"{class_dict}.get({key!r}, MISSING)", item, where, covered)
                elif not isinstance(item, (types.MemberDescriptorType, types.GetSetDescriptorType)):
                    self.value(f"{class_dict}.get({key!r}, MISSING)", item, where, depth, covered)

    # Roots.
    def globals_of(self, code: types.CodeType | None, module_globals: dict, global_chains) -> None:
        """Guard the globals (and attributes of Python modules) that ``code`` reads."""
        g = self.bind(module_globals, "g")
        module_name = module_globals.get("__name__", "?")
        if code is not None:
            module = sys.modules.get(module_name)
            if module is None or vars(module) is not module_globals:
                self.not_replayable = f"code that runs with globals other than its module's ({module_name})"
            elif _imports(code):
                self.not_replayable = (
                    f"{code.co_qualname} imports inside a function (what it reads is not recorded)"
                )
            self.global_reads.append((module_name, tuple(global_chains)))
            if module_name.split(".")[0] not in ("torch", "thunder_core"):  # versioned (generated code)
                self.codes_run.append((module_name, code))
        if id(module_globals) not in self._walked:
            self._walked.add(id(module_globals))
            self.namespaces.append((module_globals, f"the globals of {module_name}"))
        for chain in global_chains:
            root = chain[0]
            value = module_globals.get(root, MISSING)
            where = f"global {root} (in {module_name})"
            self.value(
                f"{g}.get({root!r}, MISSING)", value, where, covered_by=self._versioned(module_globals)
            )
            path = root
            for position, attr in enumerate(chain[1:], 1):
                if not isinstance(value, types.ModuleType):
                    break
                if value.__name__.split(".")[0] in _STABLE_MODULES:
                    self._stable_module_read(value, chain[position:], path)
                    break
                namespace = vars(value)
                owner = self.bind(namespace, "g")
                value = namespace.get(attr, MISSING)
                path = f"{path}.{attr}"
                where = f"global {path} (in {module_name})"
                covered = (owner,) if type(namespace) is dict else ()
                self.value(f"{owner}.get({attr!r}, MISSING)", value, where, covered_by=covered)

    def _stable_module_read(self, module, attributes: tuple, path: str) -> None:
        """Note a value read from a library module that is not guarded (``sys.argv``,
        ``torch.backends.cudnn.enabled``): fixed within a process, but another process may hold
        another value, which the on-disk cache compares (``stable_reads``)."""
        value = module
        for attr in attributes:
            path = f"{path}.{attr}"
            value = getattr(value, attr, MISSING)
            if not isinstance(value, types.ModuleType):
                break
        if not isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
            if not callable(value) or not hasattr(value, "__qualname__"):
                self.stable_reads.append((path, value))

    def ambient_state(self) -> None:
        """Grad mode, autocast, default dtype and device, TF32/determinism flags, modes, global hooks."""
        try:
            from torch._C._dynamo.guards import GlobalStateGuard
        except ImportError:  # pragma: no cover - every supported torch has it
            state = _ambient_tuple()
            self.equal("_ambient()", state, "torch state (grad, autocast, default dtype, determinism)")
            self._namespace["_ambient"] = _ambient_tuple
        else:
            guard = GlobalStateGuard()
            name = self.bind(guard, "state")
            self.condition(  # on a change, the value names the field that changed (``grad_mode``)
                f"({name}.check() or 'changed: ' + {name}.reason())",
                "v is True",
                "torch state (grad mode, autocast, default dtype, determinism, TF32, threads)",
                True,
            )
        self._namespace["_modes"] = torch._C._len_torch_function_stack
        self.equal("_modes()", torch._C._len_torch_function_stack(), "number of active TorchFunctionModes")
        context = torch._GLOBAL_DEVICE_CONTEXT  # a threading.local: its __dict__ is this thread's
        current = context.__dict__.get("device_context")
        self.value(
            f"{self.bind(context)}.__dict__.get('device_context')", current, "torch.set_default_device"
        )
        hooks = torch.nn.modules.module
        tables = [getattr(hooks, key) for key in _GLOBAL_HOOKS]
        if any(tables):
            for key, table in zip(_GLOBAL_HOOKS, tables):
                self._walked.discard(id(table))
                self.contents(table, f"torch.nn.modules.module.{key}")
        else:
            self._no_hooks(tables, "global module hooks (torch.nn.modules.module)", "none")

    def lifted_tensors(self, tensors) -> None:
        """Guard the metadata of real tensors the trace takes as inputs (their data is read live)."""
        for t in tensors:
            name = self.bind(t, "t")
            metadata = (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)
            where = self.tensor_paths.get(id(t), "a tensor the function uses")
            self.equal(f"({name}.shape, {name}.stride(), {name}.dtype, {name}.device, {name}.requires_grad)",
                       metadata, f"shape, strides, dtype, device, requires_grad of {where}")  # fmt: skip

    def random_draw(self) -> str | None:
        """Where a NumPy generator reachable from the program was drawn from since it was found."""
        for generator, state, what in self.random_generators:
            if not same_generator_state(state, generator_state(generator)):
                return f"the function draws from NumPy's random generator {what}"
        return None

    def check_arrays_read(self) -> None:
        """A large NumPy array whose data went into the trace cannot be guarded: refuse to compile."""
        for array_id in self.arrays_read:
            if array_id in self.large_arrays:
                what, size = self.large_arrays[array_id]
                raise TooMuchState(f"{what} is a NumPy array of {size} elements the program reads; it could "
                                   "change in place between calls")  # fmt: skip

    def mark_tree_walked(self) -> None:
        """The checks so far come from walking the roots; later ones from what capture read."""
        self.tree_checks = len(self._checks)

    def build(self) -> Guard:
        checks = list(self._checks)
        if self.argument_ints.checks and self.argument_ints.may_be_free(self.codes_run):
            for index in self.argument_ints.checks:
                checks[index] = (checks[index][0], "type(v) is int")
        return Guard(checks, self._namespace, list(self._descriptions), list(self._covers))

    def build_captured_part(self) -> Guard:
        """A guard of only the checks added after the walk of the roots (globals read, lifted tensors)."""
        n = self.tree_checks
        return Guard(self._checks[n:], self._namespace, self._descriptions[n:], self._covers[n:])


class CompositeGuard:
    """Two guards checked in turn, numbered as one: a re-walked tree and the captured part."""

    def __init__(self, first: Guard, second: Guard):
        self.first, self.second = first, second
        self._offset = len(first)

    def check(self):
        failure = self.first.check()
        if failure is not None:
            return failure
        failure = self.second.check()
        return None if failure is None else (failure[0] + self._offset, failure[1])

    def __len__(self) -> int:
        return self._offset + len(self.second)

    def failures(self) -> list[tuple[int, Any]]:
        return self.first.failures() + [(i + self._offset, v) for i, v in self.second.failures()]

    def describe(self, failure: tuple[int, Any]) -> str:
        index, current = failure
        if index < self._offset:
            return self.first.describe(failure)
        return self.second.describe((index - self._offset, current))


def _holds_float_zero(value) -> bool:
    if type(value) is float or type(value) is complex:
        return value == 0 or (type(value) is complex and (value.real == 0 or value.imag == 0))
    return type(value) in (tuple, frozenset) and any(_holds_float_zero(item) for item in value)


def identical_values(a, b) -> bool:
    """``a == b`` of the same types, telling ``-0.0`` from ``0.0`` (guards of values holding a zero)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if type(a) is complex:
        return identical_values(a.real, b.real) and identical_values(a.imag, b.imag)
    if type(a) is tuple:
        return len(a) == len(b) and all(identical_values(x, y) for x, y in zip(a, b))
    if type(a) is frozenset:  # zeros of both signs are one member of a set
        return a == b
    return a == b


def _array_equal(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())


def _literal(value) -> bool:
    return type(value) in (bool, int, str, type(None)) or (type(value) is float and value == value)


def _slots(cls) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += (
            [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
        )
    return names


def _ambient_tuple() -> tuple:
    return (
        torch.is_grad_enabled(),
        torch.get_default_dtype(),
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.are_deterministic_algorithms_enabled(),
    )


@functools.lru_cache(maxsize=4096)
def _imports(code: types.CodeType) -> bool:
    """Whether ``code`` (or a function nested in it) runs an import statement."""
    if any(instruction.opname == "IMPORT_NAME" for instruction in dis.get_instructions(code)):
        return True
    return any(isinstance(c, types.CodeType) and _imports(c) for c in code.co_consts)
