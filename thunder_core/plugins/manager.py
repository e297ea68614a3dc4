"""Discovering plugins from entry points and loading them, one status per plugin.

Discovery reads metadata only (name, distribution, version, requirements). A plugin's
module is imported when it is probed (``thunder-core plugins``, or when a job considers
it); its ``thunder_core_register_*`` hooks run only when it is selected. Every failure is
caught and kept as the plugin's status, so one plugin never breaks ``import thunder_core``,
``jit`` or another plugin.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as metadata
import importlib.util
import inspect
import re
import time
import traceback
from dataclasses import dataclass, field

import pluggy

from thunder_core.plugins import hookspecs
from thunder_core.plugins.errors import PluginError
from thunder_core.plugins.hookspecs import STAGES, Availability

GROUPS = {"executor": "thunder_core.executors", "plugin": "thunder_core.plugins"}
CORE_DISTRIBUTION = "thunder-core"

AVAILABLE, UNAVAILABLE, INCOMPATIBLE, BROKEN, STALE, DISABLED, NOT_LOADED = (
    "available",
    "unavailable",
    "incompatible",
    "broken",
    "stale",
    "disabled",
    "not loaded",
)
PROBLEMS = (BROKEN, INCOMPATIBLE, STALE)


@dataclass
class OptionSpec:
    name: str
    type: type
    default: object
    help: str = ""


@dataclass
class PluginInfo:
    """One discovered executor or transform plugin and what is known about it."""

    name: str
    kind: str  # "executor" | "plugin"
    entry_point: str  # "module" or "module:attribute"
    distribution: str | None
    version: str | None
    distribution_metadata: object = field(default=None, repr=False)  # its importlib.metadata.Distribution
    status: str = NOT_LOADED
    reason: str = ""
    remedy: str = ""
    import_seconds: float | None = None
    module: object = None
    registered: bool = False
    executors: list = field(default_factory=list)
    passes: list = field(default_factory=list)  # (stage, fn, name)
    module_transforms: list = field(default_factory=list)  # (fn, name)
    options: dict[str, OptionSpec] = field(default_factory=dict)

    @functools.cached_property
    def requires_core(self) -> str | None:
        """The thunder-core specifier the distribution declares, read when the plugin is probed
        (parsing every distribution's requirements at discovery cost a job that loads none)."""
        if self.distribution_metadata is None or _is_core(self.distribution):
            return None  # thunder-core's own executors
        return _core_requirement(self.distribution_metadata)

    @property
    def label(self) -> str:
        origin = f"{self.distribution} {self.version}" if self.distribution else "unknown distribution"
        return f"{self.kind} {self.name!r} (entry point {self.entry_point!r} from {origin})"

    def explanation(self) -> str:
        text = f"{self.label} is {self.status}"
        if self.reason:
            text += f": {self.reason}"
        if self.remedy:
            text += f". To fix: {self.remedy}"
        return text

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.entry_point,
            "status": self.status,
            "reason": self.reason,
            "remedy": self.remedy,
            "import_seconds": self.import_seconds,
        }


def _core_version() -> str:
    from thunder_core._version import __version__

    return __version__


def _is_core(distribution: str | None) -> bool:
    """Whether ``distribution`` names thunder-core (compared as PEP 503 normalizes names)."""
    return distribution is not None and re.sub(r"[-_.]+", "-", distribution).lower() == CORE_DISTRIBUTION


def _core_requirement(dist) -> str | None:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == CORE_DISTRIBUTION and (
            req.marker is None or req.marker.evaluate({"extra": ""})
        ):
            return str(req.specifier) or None
    return None


class PluginManager:
    """All discovered plugins of this process, and the pluggy manager that calls their hooks."""

    def __init__(self):
        self.pluggy = pluggy.PluginManager(hookspecs.PROJECT)
        self.pluggy.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._discover()

    # Discovery: metadata only.
    def _discover(self) -> None:
        names: dict[int, tuple[object, str, str]] = {}  # id(distribution) -> (it, name, version)

        def name_and_version(dist) -> tuple[str | None, str | None]:
            if dist is None:
                return None, None
            if id(dist) not in names:  # each access to .metadata parses the METADATA file again
                found = dist.metadata  # (the distribution is kept in the value: its id stays its own)
                names[id(dist)] = (dist, found["Name"], found["Version"])
            return names[id(dist)][1:]

        every = metadata.entry_points()  # one pass over the installed distributions for all groups
        for kind, group in GROUPS.items():
            for ep in every.select(group=group):
                dist = getattr(ep, "dist", None)
                distribution, version = name_and_version(dist)
                info = PluginInfo(
                    name=ep.name,
                    kind=kind,
                    entry_point=ep.value,
                    distribution=distribution,
                    version=version,
                    distribution_metadata=dist,
                )
                if ep.name in self.plugins:
                    other = self.plugins[ep.name]
                    if (other.distribution, other.entry_point) == (info.distribution, info.entry_point):
                        continue  # the same distribution seen twice on sys.path
                    info.status, info.reason = BROKEN, f"its name collides with {other.label}"
                    info.remedy = f"uninstall one of {other.distribution} and {info.distribution}"
                    self.plugins[f"{ep.name}@{info.distribution}"] = info
                    continue
                self.plugins[ep.name] = info

    def names(self, kind: str | None = None) -> list[str]:
        return sorted(n for n, p in self.plugins.items() if kind is None or p.kind == kind)

    # Probing: incompatible and stale from metadata, then import, then the probe hook.
    def probe(self, info: PluginInfo) -> PluginInfo:
        if info.status != NOT_LOADED:
            return info
        if info.requires_core is not None:
            from packaging.specifiers import SpecifierSet
            from packaging.version import Version

            if Version(_core_version()) not in SpecifierSet(info.requires_core, prereleases=True):
                info.status = INCOMPATIBLE
                info.reason = (
                    f"built for thunder-core{info.requires_core}, but this is thunder-core {_core_version()}"
                )
                info.remedy = (
                    f"pip install -U {info.distribution}, or a thunder-core matching {info.requires_core}"
                )
                return info
        module_name = info.entry_point.split(":")[0]
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as error:
            spec, info.reason = None, f"{type(error).__name__}: {error}"
        if spec is None:
            info.status = STALE
            info.reason = f"its entry point names module {module_name!r}, which no longer exists" + (
                f" ({info.reason})" if info.reason else ""
            )
            info.remedy = f"reinstall {info.distribution} (pip install --force-reinstall {info.distribution}) or uninstall it"
            return info
        start = time.perf_counter()
        try:
            module = importlib.import_module(module_name)
            if ":" in info.entry_point:
                for attr in info.entry_point.split(":", 1)[1].split("."):
                    module = getattr(module, attr)
        except BaseException as error:  # noqa: BLE001 - a plugin may raise anything at import
            return self._broken(info, "import", error)
        finally:
            info.import_seconds = time.perf_counter() - start
        info.module = module
        problem = self._register_with_pluggy(info)
        if problem:
            info.status, info.reason = BROKEN, problem
            info.remedy = f"fix the hooks of {info.distribution} (see docs/writing-an-executor.md)"
            return info
        try:
            found = self._call(info, "thunder_core_probe")
        except BaseException as error:  # noqa: BLE001
            return self._broken(info, "probe", error)
        found = found if isinstance(found, Availability) else Availability.ok()
        if found.available:
            info.status = AVAILABLE
        else:
            info.status, info.reason, info.remedy = UNAVAILABLE, found.reason, found.remedy
        return info

    def _probe_again(self, info: PluginInfo) -> None:
        """What a probe finds can change while the process runs (a process group initialized,
        a device made visible): an unavailable plugin is probed again when a job asks for it."""
        try:
            found = self._call(info, "thunder_core_probe")
        except BaseException as error:  # noqa: BLE001
            self._broken(info, "probe", error)
            return
        if not isinstance(found, Availability) or found.available:
            info.status, info.reason, info.remedy = AVAILABLE, "", ""
        else:
            info.reason, info.remedy = found.reason, found.remedy

    def _register_with_pluggy(self, info: PluginInfo) -> str | None:
        known = {name for name in dir(hookspecs) if name.startswith("thunder_core_")}
        for attr, _function in inspect.getmembers(info.module, inspect.isfunction):
            if attr.startswith("thunder_core_") and attr not in known:
                return f"defines {attr}(), which is not a thunder_core hook (misspelled?); the hooks are {sorted(known)}"
        try:
            self.pluggy.register(info.module, name=f"{info.kind}:{info.name}")
            self.pluggy.check_pending()
        except pluggy.PluginValidationError as error:
            if self.pluggy.is_registered(info.module):
                self.pluggy.unregister(info.module)
            return f"invalid hook: {error}"
        except ValueError as error:  # already registered under another name
            return str(error)
        return None

    def _call(self, info: PluginInfo, hook: str, **kwargs):
        others = [p for p in self.pluggy.get_plugins() if p is not info.module]
        caller = self.pluggy.subset_hook_caller(hook, remove_plugins=others)
        return caller(**kwargs)

    def _broken(self, info: PluginInfo, stage: str, error: BaseException) -> PluginInfo:
        info.status = BROKEN
        where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
        place = f" at {where.filename}:{where.lineno}" if where else ""
        info.reason = f"{type(error).__name__} at {stage}: {error}{place}"
        info.remedy = f"report it to the maintainers of {info.distribution}, or disable it (THUNDER_CORE_DISABLE={info.name})"
        return info

    # Loading: the register hooks, for selected plugins.
    def load(self, info: PluginInfo) -> PluginInfo:
        if info.status == UNAVAILABLE and info.module is not None:
            self._probe_again(info)
        self.probe(info)
        if info.status != AVAILABLE or info.registered:
            return info
        executors, passes, options, module_transforms = [], [], {}, []

        def register_executor(executor) -> None:
            from thunder_core.executors.base import Executor

            if not isinstance(executor, Executor):
                raise TypeError(f"register() got {type(executor).__qualname__}, not a thunder_core Executor")
            executors.append(executor)

        def register_pass(stage: str, fn, name: str | None = None) -> None:
            if stage not in STAGES:
                raise ValueError(f"unknown stage {stage!r}; the stages are {list(STAGES)}")
            passes.append((stage, fn, name or getattr(fn, "__name__", "pass")))

        def register_module_transform(fn, name: str | None = None) -> None:
            if not callable(fn):
                raise TypeError(f"register() got {type(fn).__qualname__}, not a callable (module, options)")
            module_transforms.append((fn, name or getattr(fn, "__name__", "module transform")))

        def declare(name: str, type: type, default, help: str = "") -> None:
            if not isinstance(default, type):
                raise TypeError(f"option {name!r}: default {default!r} is not a {type.__name__}")
            options[name] = OptionSpec(name, type, default, help)

        try:
            self._call(info, "thunder_core_declare_options", declare=declare)
            self._call(info, "thunder_core_register_executor", register=register_executor)
            self._call(info, "thunder_core_register_passes", register=register_pass)
            self._call(info, "thunder_core_register_module_transform", register=register_module_transform)
        except BaseException as error:  # noqa: BLE001
            return self._broken(info, "register", error)
        info.executors, info.passes, info.options, info.registered = executors, passes, options, True
        info.module_transforms = module_transforms
        return info

    def require(self, name: str) -> PluginInfo:
        """The loaded plugin ``name``; raises its stored reason if it cannot be used."""
        info = self.plugins.get(name)
        if info is None:
            raise PluginError(f"no executor or plugin named {name!r}; installed: {self.names()}")
        self.load(info)
        if info.status != AVAILABLE:
            raise PluginError(info.explanation())
        return info


_manager: PluginManager | None = None


def plugin_manager() -> PluginManager:
    """The process-wide manager (discovery runs once, on first use)."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager


def reset_plugin_manager() -> None:
    """Forget discovery results (after installing or removing plugin packages)."""
    global _manager
    _manager = None
    importlib.invalidate_caches()
