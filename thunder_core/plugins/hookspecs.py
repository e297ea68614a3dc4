"""Hook specifications for thunder_core plugins (pluggy project name ``thunder_core``).

A plugin is a module named by an entry point in the group ``thunder_core.executors`` or
``thunder_core.plugins``. It implements some of these hooks, each marked ``@hookimpl``:

    from thunder_core.plugins import hookimpl, Availability

    @hookimpl
    def thunder_core_probe():
        ...

Hook names and argument names are checked when the plugin is loaded: a misspelled or
mistyped hook makes the plugin ``broken``, with a message naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pluggy

PROJECT = "thunder_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Pipeline stages a transform pass can be added at, in order.
STAGES = ("after_capture", "after_autodiff", "after_split", "after_executors")


@dataclass(frozen=True)
class Availability:
    """What a probe found: available, or not with the reason and the way to fix it."""

    available: bool
    reason: str = ""
    remedy: str = ""

    @classmethod
    def ok(cls) -> Availability:
        return cls(True)

    @classmethod
    def missing(cls, reason: str, remedy: str = "") -> Availability:
        return cls(False, reason, remedy)


@hookspec(firstresult=True)
def thunder_core_probe() -> Availability:
    """Say cheaply whether this plugin can work here.

    Look for the library without importing it (``importlib.util.find_spec``), check its
    version from metadata, check for the device. Return ``Availability.ok()`` or
    ``Availability.missing(reason, remedy)``, e.g. ``("no CUDA device", "run on a GPU
    machine")`` or ``("nvfuser not installed", "pip install nvfuser-cu128")``.
    """


@hookspec
def thunder_core_register_executor(register) -> None:
    """Create your executor(s) and call ``register(executor)`` for each.

    Called only when the plugin is available and selected: heavy imports belong here. An
    executor registered by a transform plugin (group ``thunder_core.plugins``) claims before
    every other executor of the jobs that select the plugin.
    """


@hookspec
def thunder_core_register_passes(register) -> None:
    """Add transform passes: ``register(stage, pass_fn, name=None)``.

    ``stage`` is one of ``STAGES``; ``pass_fn(trace, options) -> trace`` receives this
    plugin's options (a dict, see ``thunder_core_declare_options``). ``after_autodiff`` passes
    see the forward trace of a training program; ``after_split`` passes see and return both
    halves as a ``thunder_core.extend.TrainingTraces`` (after rematerialization, before
    lowering), to change what the forward saves and the backward recomputes.
    """


@hookspec
def thunder_core_register_module_transform(register) -> None:
    """Change a module when it is jitted: ``register(transform, name=None)``.

    ``transform(module, options)`` is called once per ``thunder_core.jit(module)`` of a job
    that selects this plugin, before anything is captured. It may change the module in place
    (broadcast or shard its parameters) and returns ``None`` or a
    ``thunder_core.extend.ModuleExtension`` that says how the jitted module differs: what
    the forward sees for each parameter while it is captured (ops recorded there become part
    of the trace), a value for the cache key, a ``no_sync()`` context, its ``state_dict``.
    """


@hookspec
def thunder_core_declare_options(declare) -> None:
    """Declare typed options: ``declare(name, type, default, help)``.

    Users set them per job (``jit(..., options={"plugin": {...}})``, or the config file);
    unknown names and wrongly typed values are errors that list what is declared.
    """
