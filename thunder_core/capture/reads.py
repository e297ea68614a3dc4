"""Which user code a capture ran, and which global names that code reads.

While a function is captured, a profile hook notes every Python function entered whose code
is the user's (not torch's, not the standard library's, not thunder_core's). The first time
a code object is entered, ``on_first_entry(code, globals)`` is called *before* its body runs,
so the values it is about to read are seen as they were before the call changed anything.

``global_chains(code)`` lists what a code object reads from its globals: each ``LOAD_GLOBAL``
name with the attribute names loaded right after it (``settings.SCALE`` ->
``("settings", "SCALE")``), found once per code object from its bytecode.
"""

from __future__ import annotations

import dis
import importlib.util
import os
import random
import sys
import sysconfig
import threading
from collections.abc import Callable
from functools import cache, lru_cache
from types import CodeType

import torch

_THUNDER_CORE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    return os.path.dirname(spec.origin) + os.sep if spec is not None and spec.origin else None


# torch, thunder_core, and the libraries torch's symbolic sizes compute with (sympy, mpmath).
_NEVER_USER = tuple(
    d
    for d in (
        os.path.dirname(torch.__file__) + os.sep,
        _THUNDER_CORE_DIR,
        _package_dir("sympy"),
        _package_dir("mpmath"),
    )
    if d is not None
)
_STDLIB = tuple({sysconfig.get_paths()["stdlib"] + os.sep, os.path.dirname(os.__file__) + os.sep})
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
# A module's hook tables, and those for every module (torch.nn.modules.module): what a forward
# runs besides its own code.
MODULE_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                "_backward_pre_hooks")  # fmt: skip
GLOBAL_MODULE_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                       "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs",
                       "_global_forward_hooks_always_called")  # fmt: skip
# Objects of these modules hold machinery (locks, handlers, streams), not program values.
OPAQUE_MODULES = ("logging", "threading", "_thread", "multiprocessing", "concurrent", "asyncio", "io")
_GLOBAL_LOADS = {"LOAD_GLOBAL", "LOAD_NAME"}
_ATTR_LOADS = {"LOAD_ATTR", "LOAD_METHOD"}


@cache
def is_user_code(filename: str) -> bool:
    """True for code outside torch, thunder_core and the standard library (installed libraries count)."""
    if filename.startswith(_NEVER_USER) or filename.startswith("<frozen"):
        return False
    if any(marker in filename for marker in _INSTALLED):
        return True
    return not filename.startswith(_STDLIB)


@lru_cache(maxsize=4096)
def global_chains(code: CodeType) -> tuple[tuple[str, ...], ...]:
    """The global names ``code`` loads, each with the attributes loaded directly after it."""
    chains: dict[tuple[str, ...], None] = {}
    chain: list[str] | None = None
    for instruction in dis.get_instructions(code):
        if instruction.opname in _GLOBAL_LOADS:
            if chain:
                chains[tuple(chain)] = None
            chain = [instruction.argval]
        elif chain is not None and instruction.opname in _ATTR_LOADS:
            chain.append(instruction.argval)
        else:
            if chain:
                chains[tuple(chain)] = None
            chain = None
    if chain:
        chains[tuple(chain)] = None
    return tuple(chains)


_NOT_DRAWS = frozenset({"seed", "getstate", "setstate", "get_state", "set_state", "__init__", "__new__"})


def generator_state(generator):
    """A snapshot of a NumPy ``Generator`` or ``RandomState``, or None for anything else."""
    bit_generator = getattr(generator, "bit_generator", None)
    if bit_generator is not None:
        return bit_generator.state
    get_state = getattr(generator, "get_state", None)
    return get_state(legacy=False) if callable(get_state) else None


def same_generator_state(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_generator_state(a[k], b[k]) for k in a)
    if type(a).__name__ == "ndarray" or type(b).__name__ == "ndarray":
        import numpy

        return bool(numpy.array_equal(a, b))
    return a == b


def _numpy_global_state():
    """NumPy's global generator state (``numpy.random.rand`` and friends), if NumPy is loaded.

    Its methods are compiled by Cython, which the profile hook does not see being called."""
    numpy_random = sys.modules.get("numpy.random")
    generator = getattr(getattr(numpy_random, "mtrand", None), "_rand", None)
    return generator_state(generator) if generator is not None else None


_GENERATOR_KINDS: dict[type, str | None] = {}  # type of a bound method's owner -> generator kind


def _generator_kind(owner_type: type) -> str | None:
    kind = _GENERATOR_KINDS.get(owner_type, False)
    if kind is False:
        if issubclass(owner_type, random.Random):
            kind = "Python's random module"
        elif owner_type.__module__.startswith("numpy.random"):
            kind = "NumPy's random generator"
        else:
            kind = None
        _GENERATOR_KINDS[owner_type] = kind
    return kind


def _python_random_generator(fn) -> str | None:
    """The name of a Python-level random number generator ``fn`` draws from, or None.

    Called for every C function the capture calls: the owner's type decides, cached per type.
    """
    owner = getattr(fn, "__self__", None)
    if owner is None:
        return None
    kind = _generator_kind(type(owner))
    if kind is None:
        return None
    name = getattr(fn, "__name__", "random")
    return None if name in _NOT_DRAWS else f"{kind} ({name})"


_TORCH_GENERATOR_SETTERS = frozenset(
    {"manual_seed", "seed", "set_state", "set_offset", "graphsafe_set_state"}
)


# torch's Python-level seeding functions: seen as calls where C calls are not (CallHook.c_events).
_TORCH_SEEDING = frozenset(
    f.__code__ for f in (torch.random.manual_seed, torch.random.seed, torch.random.set_rng_state)
)


def torch_generator_reset(fn) -> str | None:
    """``torch.Generator.manual_seed`` and the other calls that set a torch generator's state, named."""
    name = getattr(fn, "__name__", "")
    if name in _TORCH_GENERATOR_SETTERS and isinstance(getattr(fn, "__self__", None), torch.Generator):
        return f"torch's random generator ({name})"
    return None


def _called_by_user(frame) -> bool:
    """True when the nearest caller that is user code or thunder_core is user code."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_THUNDER_CORE_DIR):
            return False
        if is_user_code(filename):
            return True
        frame = frame.f_back
    return False


def _importing(frame) -> bool:
    """True while an import runs during capture (below the capture's own frames)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen importlib"):
            return True
        if filename.startswith(_THUNDER_CORE_DIR):
            return False
        frame = frame.f_back
    return False


def _user_place(frame) -> str:
    """``file:line`` of the innermost user code at ``frame``."""
    while frame is not None and not is_user_code(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "the function"


def _drawn_by_libraries(frame) -> bool:
    """Whether the code that called into the standard library at ``frame`` is torch's,
    thunder_core's or the symbolic-size libraries' (sympy picks random test points)."""
    while frame is not None and frame.f_code.co_filename.startswith(_STDLIB):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_NEVER_USER)


def _restorable(installed) -> bool:
    """Whether what ``sys.getprofile()`` or ``sys.gettrace()`` gave can be put back with the
    matching setter (and called with chained events): a Python callable, or nothing. A C-level
    profiler's object (``cProfile``, ``torch.profiler`` with ``with_stack=True``) cannot."""
    return installed is None or callable(installed)


_PROFILE_SLOT = (sys.getprofile, sys.setprofile)
_TRACE_SLOT = (sys.gettrace, sys.settrace)
_hook_slots = threading.local()  # .slot: where this thread's innermost CallHook is installed


def call_hook_slot() -> tuple[Callable, Callable]:
    """``(getter, setter)`` of where this thread's active ``CallHook`` is installed (the profile
    slot when none is active)."""
    return getattr(_hook_slots, "slot", _PROFILE_SLOT)


class CallHook:
    """Context manager: ``hook(frame, event, arg)`` receives the interpreter's events while active.

    Installed with ``sys.setprofile`` (Python calls, and C calls as ``c_call``), chained: a
    Python-level profile function already installed is what ``__enter__`` returns, for ``hook``
    to pass every event on to; ``cProfile`` cannot take chained events and is paused while
    active and resumed after. A C-level profiler that can be neither chained nor put back
    (``torch.profiler`` with ``with_stack=True``) is left running and ``hook`` goes into
    ``sys.settrace`` instead, chained to the trace function there (a debugger, coverage):
    ``c_events`` is then False (no ``c_call`` events), and ``hook`` must return what the chained
    function returns (a frame's local trace function).
    """

    def __init__(self, hook: Callable):
        self._hook = hook
        self._slot = _PROFILE_SLOT
        self._previous = None
        self._paused = None
        self._outer_slot = None
        self.c_events = True

    def __enter__(self):
        profile = sys.getprofile()
        if not _restorable(profile) and hasattr(profile, "enable") and hasattr(profile, "disable"):
            profile.disable()  # cProfile: paused, resumed by __exit__
            self._paused = profile
        elif not _restorable(profile) and _restorable(sys.gettrace()):
            self._slot, self.c_events = _TRACE_SLOT, False
        get, install = self._slot
        previous = get()
        self._previous = previous if _restorable(previous) else None  # otherwise lost until its owner ends it
        self._outer_slot = getattr(_hook_slots, "slot", None)
        _hook_slots.slot = self._slot
        install(self._hook)
        return self._previous

    def __exit__(self, *exc) -> None:
        self._slot[1](self._previous)
        _hook_slots.slot = self._outer_slot if self._outer_slot is not None else _PROFILE_SLOT
        if self._paused is not None:
            self._paused.enable()
            self._paused = None


class ExecutedUserCode:
    """Context manager: calls ``on_first_entry(code, f_globals)`` for each user code object entered.

    Also notes the first draw from a Python-level random number generator (``random``,
    ``numpy.random``): a value drawn while capturing would be frozen into the trace, so
    ``random_draw`` names it and the line, for capture to refuse. Watches through ``CallHook``
    (an already installed Python-level profiler keeps receiving its events; ``cProfile`` is
    paused while capturing; under ``torch.profiler(with_stack=True)`` only Python calls are
    seen, and a draw from the ``random`` module's global generator is found by its state).
    """

    def __init__(self, on_first_entry: Callable[[CodeType, dict], None]):
        self._on_first_entry = on_first_entry
        self._seen: set[CodeType] = set()
        self._previous = None
        self._hook: CallHook | None = None
        self.random_draw: str | None = None
        self.generator_reset: str | None = None  # where the program set a torch generator's state

    def _profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code in _TORCH_SEEDING and self.generator_reset is None and _called_by_user(frame.f_back):
                self.generator_reset = (
                    f"{_user_place(frame)} sets the state of torch's random generator ({code.co_name})"
                )
            if code not in self._seen and is_user_code(code.co_filename):
                # Code an import runs (a module body, a class body) sets state up once: not guarded,
                # and not marked seen, so the program calling it later still records its reads.
                if not _importing(frame):
                    self._seen.add(code)
                    self._on_first_entry(code, frame.f_globals)
        elif event == "c_call" and self.generator_reset is None and torch_generator_reset(arg) is not None:
            if _called_by_user(frame):
                self.generator_reset = f"{_user_place(frame)} sets the state of {torch_generator_reset(arg)}"
        elif event == "c_call" and self.random_draw is None:
            generator = _python_random_generator(arg)
            if generator is not None and not _importing(frame) and not _drawn_by_libraries(frame):
                self.random_draw = f"{_user_place(frame)} draws from {generator}"
        if self._previous is not None:
            return self._previous(frame, event, arg)
        return None

    def __enter__(self) -> ExecutedUserCode:
        self._numpy_global = _numpy_global_state()
        self._hook = CallHook(self._profile)
        self._previous = self._hook.__enter__()
        # Watched through sys.settrace, C calls are not seen: the global generator is compared.
        self._random_global = None if self._hook.c_events else random.getstate()
        return self

    def __exit__(self, *exc) -> None:
        self._hook.__exit__()
        before = self._numpy_global  # None when NumPy was not loaded yet: importing it draws nothing
        if (
            self.random_draw is None
            and before is not None
            and not same_generator_state(before, _numpy_global_state())
        ):
            self.random_draw = "the function draws from NumPy's global random generator (numpy.random.*)"
        if self.random_draw is None and self._random_global not in (None, random.getstate()):
            self.random_draw = "the function draws from Python's random module (random.*)"
