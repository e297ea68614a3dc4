"""Per-job selection of executors and plugins: the API, the environment, a config file.

Precedence, highest first: ``jit(executors=..., plugins=..., options=...)``; the
environment (``THUNDER_CORE_EXECUTORS``, ``THUNDER_CORE_PLUGINS``, ``THUNDER_CORE_DISABLE``,
``THUNDER_CORE_NO_AUTOLOAD``, ``THUNDER_CORE_STRICT``, ``THUNDER_CORE_SELECT``,
``THUNDER_CORE_CPU_MEMORY``, ``THUNDER_CORE_COMPILE_IN_BACKGROUND``, ``THUNDER_CORE_PROGRESS``,
``THUNDER_CORE_CACHE_DIR``, ``THUNDER_CORE_CACHE_TRACES``); the config file (the TOML file
``THUNDER_CORE_CONFIG`` names, else ``[tool.thunder-core]`` in the nearest pyproject.toml).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from thunder_core.disk_cache import DEFAULT_CACHE_DIR
from thunder_core.plugins.errors import ConfigError

CONFIG_KEYS = {
    "executors": "ordered list of executor names: the claim priority (torch is always last)",
    "plugins": "list of transform plugins to enable",
    "disable": "list of executors and plugins never to use",
    "options": "table of per-executor / per-plugin option tables",
    "autoload": "false: use only the core's executors and the ones named explicitly",
    "strict": "true: any broken, incompatible or stale plugin is an error",
    "select": '"measure" (default): time each claim against its alternatives on its first call; '
    '"priority": keep every claim as the claim order made it',
    "compile_in_background": '"never" (default): every compile finishes before the program runs (see '
    "recompiled_regions); "
    '"recompiles": a program compiled again for a function (new sizes, a new signature) runs its fusion '
    'regions with torch while their executor compiles them on a worker thread; "always": the first too',
    "recompiled_regions": '"at_second_call" (default): a program compiled again for a function with fixed '
    "sizes runs its fusion regions' operations with torch at its first call and compiles them at its "
    'second (a program run once never compiles kernels); "at_once": before its first call',
    "progress": '"auto" (default): a compile running for more than 2 s shows what it is doing when stderr '
    'is a terminal; "never": never; "always": wherever stderr goes',
    "cache_traces": "true: later processes reuse captured traces from the disk cache (off by default: see "
    "docs/getting-started.md for what it cannot see)",
    "cache_dir": "where compiled traces are kept for later processes (default: thunder_core in the user's "
    'cache directory); "off" turns the disk cache off',
    "cpu_memory": '"keep" (default): glibc keeps freed CPU memory for reuse (no page faults for a '
    'program\'s intermediates; process-wide, set by the first CPU program); "release": malloc as it is',
}
SELECTIONS = ("measure", "priority")
CPU_MEMORY = ("keep", "release")
BACKGROUND = ("never", "recompiles", "always")
RECOMPILED_REGIONS = ("at_second_call", "at_once")
PROGRESS = ("auto", "never", "always")
ENV_FLAGS = ("1", "true", "yes", "on")
CACHE_OFF = "off"


@dataclass
class JobConfig:
    """What one job asked for, and where each part came from."""

    executors: list[str] | None = None
    plugins: list[str] = field(default_factory=list)
    disabled: dict[str, str] = field(default_factory=dict)  # name -> by what
    options: dict[str, dict] = field(default_factory=dict)
    autoload: bool = True
    strict: bool = False
    select: str = "measure"
    cpu_memory: str = "keep"
    compile_in_background: str = "never"
    recompiled_regions: str = "at_second_call"
    progress: str = "auto"
    cache_dir: str | None = None  # the on-disk cache's directory; None: off
    cache_traces: bool = False  # captured traces on disk too (not only measured executor choices)
    sources: dict[str, str] = field(default_factory=dict)


def _names(value, where: str) -> list[str]:
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of names, got {value!r}")
    return list(value)


def _parse_toml(text: str) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads(text)


def find_config_file(start: Path | None = None) -> tuple[Path | None, dict]:
    """The config file in effect and its thunder-core table."""
    named = os.environ.get("THUNDER_CORE_CONFIG")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"THUNDER_CORE_CONFIG names {named!r}, which is not a file")
        data = _parse_toml(path.read_text())
        table = data.get("tool", {}).get("thunder-core", data)
        return path, table
    directory = (start or Path.cwd()).resolve()
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            text = candidate.read_text()
            # A [tool.thunder-core] table, however written, names thunder-core: a project's
            # pyproject.toml without it is not parsed (TOML's parser costs a first call 7 ms).
            if "thunder-core" not in text:
                return candidate, {}
            return candidate, _parse_toml(text).get("tool", {}).get("thunder-core", {})
    return None, {}


def _check_keys(table: dict, where: str) -> None:
    unknown = sorted(set(table) - set(CONFIG_KEYS))
    if unknown:
        known = "\n".join(f"  {k}: {v}" for k, v in CONFIG_KEYS.items())
        raise ConfigError(f"{where}: unknown key(s) {unknown}. The known keys are:\n{known}")


def _choice(key: str, choices: tuple, explained: str, sources) -> tuple[str, str]:
    """The first value given among ``sources`` ((where, value) pairs, highest precedence first)."""
    for source, value in sources:
        if value is None:
            continue
        if value not in choices:
            raise ConfigError(f"{source}: {key} must be one of {list(choices)}, got {value!r} ({explained})")
        return value, source
    return choices[0], "default"


def _selection(select, env, table: dict, where: str) -> tuple[str, str]:
    return _choice(
        "select",
        SELECTIONS,
        "'measure' times the executors that can run an operation and keeps the fastest; "
        "'priority' keeps the claim order",
        [
            ("jit(select=...)", select),
            ("THUNDER_CORE_SELECT", env.get("THUNDER_CORE_SELECT") or None),
            (f"{where}: select", table.get("select")),
        ],
    )


def _cpu_memory(env, table: dict, where: str) -> tuple[str, str]:
    return _choice(
        "cpu_memory",
        CPU_MEMORY,
        "'keep' keeps freed CPU memory for reuse; 'release' leaves malloc as it is",
        [
            ("THUNDER_CORE_CPU_MEMORY", env.get("THUNDER_CORE_CPU_MEMORY") or None),
            (f"{where}: cpu_memory", table.get("cpu_memory")),
        ],
    )


def _progress(env, table: dict, where: str) -> tuple[str, str]:
    return _choice(
        "progress",
        PROGRESS,
        "'auto' shows a long compile's progress on a terminal, 'never' turns it off, 'always' shows it anywhere",
        [
            ("THUNDER_CORE_PROGRESS", env.get("THUNDER_CORE_PROGRESS") or None),
            (f"{where}: progress", table.get("progress")),
        ],
    )


def _recompiled_regions(env, table: dict, where: str) -> tuple[str, str]:
    return _choice(
        "recompiled_regions",
        RECOMPILED_REGIONS,
        "'at_second_call' compiles a recompiled program's fusion regions at its second call, "
        "'at_once' before its first",
        [
            ("THUNDER_CORE_RECOMPILED_REGIONS", env.get("THUNDER_CORE_RECOMPILED_REGIONS") or None),
            (f"{where}: recompiled_regions", table.get("recompiled_regions")),
        ],
    )


def _background(value, env, table: dict, where: str) -> tuple[str, str]:
    return _choice(
        "compile_in_background",
        BACKGROUND,
        "'never' compiles before running, 'recompiles' compiles a function's later programs beside "
        "them, 'always' every program",
        [
            ("jit(compile_in_background=...)", value),
            ("THUNDER_CORE_COMPILE_IN_BACKGROUND", env.get("THUNDER_CORE_COMPILE_IN_BACKGROUND") or None),
            (f"{where}: compile_in_background", table.get("compile_in_background")),
        ],
    )


def _cache_dir(value, env, table: dict, where: str) -> tuple[str | None, str]:
    """The disk cache's directory (None: off): jit(cache_dir=...) > THUNDER_CORE_CACHE_DIR > the
    config file's cache_dir > the user's cache directory."""
    if value is None:
        return None, "jit(cache_dir=None)"
    sources = [
        ("jit(cache_dir=...)", None if value is DEFAULT_CACHE_DIR else value),
        ("THUNDER_CORE_CACHE_DIR", env.get("THUNDER_CORE_CACHE_DIR") or None),
        (f"{where}: cache_dir", table.get("cache_dir")),
    ]
    for source, given in sources:
        if given is None:
            continue
        if not isinstance(given, (str, os.PathLike)):
            raise ConfigError(f"{source}: cache_dir must be a directory path or {CACHE_OFF!r}, got {given!r}")
        given = os.fspath(given)
        return (None if given.lower() == CACHE_OFF else given), source
    from platformdirs import user_cache_dir

    return user_cache_dir("thunder_core", appauthor=False), "default"


def _cache_traces(value, env, table: dict, where: str) -> tuple[bool, str]:
    """Whether captured traces are stored and reused: jit(cache_traces=...) >
    THUNDER_CORE_CACHE_TRACES > the config file's cache_traces > off."""
    if value is not None:
        return bool(value), "jit(cache_traces=...)"
    if env.get("THUNDER_CORE_CACHE_TRACES"):
        return env["THUNDER_CORE_CACHE_TRACES"].lower() in ENV_FLAGS, "THUNDER_CORE_CACHE_TRACES"
    if "cache_traces" in table:
        if not isinstance(table["cache_traces"], bool):
            raise ConfigError(f"{where}: cache_traces must be true or false, got {table['cache_traces']!r}")
        return table["cache_traces"], where
    return False, "default"


def resolve(
    *,
    executors=None,
    plugins=None,
    options=None,
    disable=None,
    select=None,
    compile_in_background=None,
    cache_dir=DEFAULT_CACHE_DIR,
    cache_traces=None,
) -> JobConfig:
    """Combine the three sources into one JobConfig (names are checked later, against discovery)."""
    path, table = find_config_file()
    where = f"config file {path}" if path else "config"
    _check_keys(table, where)
    config = JobConfig()
    env = os.environ

    # Ordered executor list: API > environment > config file.
    if executors is not None:
        config.executors, config.sources["executors"] = (
            _names(executors, "jit(executors=...)"),
            "jit(executors=...)",
        )
    elif env.get("THUNDER_CORE_EXECUTORS"):
        config.executors = _names(env["THUNDER_CORE_EXECUTORS"], "THUNDER_CORE_EXECUTORS")
        config.sources["executors"] = "THUNDER_CORE_EXECUTORS"
    elif "executors" in table:
        config.executors, config.sources["executors"] = (
            _names(table["executors"], f"{where}: executors"),
            where,
        )

    if plugins is not None:
        config.plugins, config.sources["plugins"] = _names(plugins, "jit(plugins=...)"), "jit(plugins=...)"
    elif env.get("THUNDER_CORE_PLUGINS"):
        config.plugins = _names(env["THUNDER_CORE_PLUGINS"], "THUNDER_CORE_PLUGINS")
        config.sources["plugins"] = "THUNDER_CORE_PLUGINS"
    elif "plugins" in table:
        config.plugins, config.sources["plugins"] = _names(table["plugins"], f"{where}: plugins"), where

    # Disabling: a name listed explicitly by a higher-precedence source stays enabled.
    explicit = set(config.executors or []) | set(config.plugins)
    ranked = [
        ("jit(disable=...)", disable, 0),
        ("THUNDER_CORE_DISABLE", env.get("THUNDER_CORE_DISABLE"), 1),
        (where, table.get("disable"), 2),
    ]
    rank_of_lists = {
        "jit(executors=...)": 0,
        "jit(plugins=...)": 0,
        "THUNDER_CORE_EXECUTORS": 1,
        "THUNDER_CORE_PLUGINS": 1,
    }
    for source, value, rank in ranked:
        if not value:
            continue
        for name in _names(value, source):
            chosen_by = [s for key, s in config.sources.items() if name in (getattr(config, key) or [])]
            if name in explicit and any(rank_of_lists.get(s, 2) < rank for s in chosen_by):
                continue
            config.disabled.setdefault(name, f"disabled by {source}")

    options_table = table.get("options", {})
    if not isinstance(options_table, dict):
        raise ConfigError(f"{where}: options must be a table of tables, got {options_table!r}")
    merged = {k: dict(v) for k, v in options_table.items()}
    for name, values in (options or {}).items():
        merged.setdefault(name, {}).update(values)
    config.options = merged

    autoload = table.get("autoload", True)
    if env.get("THUNDER_CORE_NO_AUTOLOAD", "").lower() in ENV_FLAGS:
        autoload = False
        config.sources["autoload"] = "THUNDER_CORE_NO_AUTOLOAD"
    config.autoload = bool(autoload)
    config.strict = env.get("THUNDER_CORE_STRICT", "").lower() in ENV_FLAGS or bool(
        table.get("strict", False)
    )
    config.select, config.sources["select"] = _selection(select, env, table, where)
    config.cpu_memory, config.sources["cpu_memory"] = _cpu_memory(env, table, where)
    config.compile_in_background, config.sources["compile_in_background"] = _background(
        compile_in_background, env, table, where
    )
    config.recompiled_regions, config.sources["recompiled_regions"] = _recompiled_regions(env, table, where)
    config.progress, config.sources["progress"] = _progress(env, table, where)
    config.cache_dir, config.sources["cache_dir"] = _cache_dir(cache_dir, env, table, where)
    config.cache_traces, config.sources["cache_traces"] = _cache_traces(cache_traces, env, table, where)
    return config
