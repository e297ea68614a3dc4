"""A job: the executors (in claim order), passes and options one jitted function uses."""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder_core.plugins.config import JobConfig
from thunder_core.plugins.errors import ConfigError, PluginError
from thunder_core.plugins.manager import AVAILABLE, PROBLEMS, PluginInfo, plugin_manager

BUILTIN = ("python", "torch")


@dataclass
class Job:
    executors: list  # Executor objects in claim order; torch last
    passes: dict[str, list] = field(default_factory=dict)  # stage -> [(fn, options, plugin name)]
    not_used: dict[str, str] = field(default_factory=dict)  # executor name -> why it is not in the list
    config: JobConfig | None = None
    executor_options: dict[str, dict] = field(default_factory=dict)  # executor name -> validated options
    module_transforms: list = field(
        default_factory=list
    )  # [(fn, options, "plugin.name")] applied by jit(module)

    @property
    def executor_names(self) -> list[str]:
        return [e.name for e in self.executors]


def _check_names(names, kind: str, manager) -> None:
    known = manager.names(kind)
    for name in names:
        if name not in manager.plugins or manager.plugins[name].kind != kind:
            raise ConfigError(f"unknown {kind} {name!r}; the installed {kind}s are {known}")


def _options_for(info: PluginInfo, config: JobConfig) -> dict:
    given = config.options.get(info.name, {})
    unknown = sorted(set(given) - set(info.options))
    if unknown:
        declared = {n: f"{o.type.__name__} = {o.default!r}" for n, o in info.options.items()}
        raise ConfigError(f"unknown option(s) {unknown} for {info.name!r}; it declares {declared or 'none'}")
    values = {}
    for name, spec in info.options.items():
        value = given.get(name, spec.default)
        if not isinstance(value, spec.type) or (spec.type is int and isinstance(value, bool)):
            raise ConfigError(
                f"option {name!r} of {info.name!r} must be a {spec.type.__name__}, got {value!r}"
            )
        values[name] = value
    return values


def build_job(config: JobConfig) -> Job:
    manager = plugin_manager()
    if config.executors is not None:
        _check_names(config.executors, "executor", manager)
    _check_names(config.plugins, "plugin", manager)
    for name in config.options:
        if name not in manager.plugins:
            raise ConfigError(
                f"options given for unknown executor or plugin {name!r}; installed: {manager.names()}"
            )
    for name in config.disabled:
        if name not in manager.plugins:
            raise ConfigError(
                f"cannot disable unknown executor or plugin {name!r}; installed: {manager.names()}"
            )

    if config.strict:
        for info in manager.plugins.values():
            if info.name in config.disabled:
                continue  # disabled by the user: its problems are not this job's
            manager.load(info)  # probe, import and register: a failing register hook is a problem too
            if info.status in PROBLEMS:
                raise PluginError(f"THUNDER_CORE_STRICT: {info.explanation()}")

    explicit = config.executors is not None
    if explicit:
        candidates = [n for n in config.executors if n not in BUILTIN]
    elif config.autoload:
        candidates = [n for n in manager.names("executor") if n not in BUILTIN]
    else:
        candidates = []
    job = Job(executors=[], config=config)
    loaded = []
    for name in manager.names("executor"):
        if name in BUILTIN:
            continue
        if name in config.disabled:
            job.not_used[name] = config.disabled[name]
        elif name not in candidates:
            job.not_used[name] = "not selected" + (
                f" ({config.sources['executors']} lists {config.executors})"
                if explicit
                else " (autoload is off)"
            )
    for name in candidates:
        if name in config.disabled:
            continue
        info = manager.load(manager.plugins[name])
        if info.status != AVAILABLE:
            if explicit:
                raise PluginError(info.explanation())
            job.not_used[name] = f"{info.status}: {info.reason}" if info.reason else info.status
            continue
        loaded.append(info)
    executors = [e.with_options(_options_for(info, config)) for info in loaded for e in info.executors]
    if not explicit:
        executors.sort(key=lambda e: (-e.default_priority, e.name))
    if "torch" not in config.disabled:
        executors += manager.require("torch").executors
    job.executors = executors

    plugin_infos = []
    for name in config.plugins:
        if name in config.disabled:
            continue
        plugin_infos.append(manager.require(name))
    # Executors a selected plugin registers (the fp8 plugin's FP8 linear) claim first.
    brought = [e.with_options(_options_for(info, config)) for info in plugin_infos for e in info.executors]
    job.executors = [*brought, *job.executors]
    for info in plugin_infos:
        for executor in info.executors:
            job.executor_options[executor.name] = _options_for(info, config)
    for info in loaded:
        for executor in info.executors:
            job.executor_options[executor.name] = _options_for(info, config)  # also passed to fusion passes
    for info in [*loaded, *plugin_infos]:
        options = _options_for(info, config)
        for stage, fn, pass_name in info.passes:
            job.passes.setdefault(stage, []).append((fn, options, f"{info.name}.{pass_name}"))
        for fn, transform_name in info.module_transforms:
            job.module_transforms.append((fn, options, f"{info.name}.{transform_name}"))
    return job
