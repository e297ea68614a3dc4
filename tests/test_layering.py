"""Import discipline: plugin packages use the public surface; the core imports downward only.

* Nothing in thunder_core names an executor or plugin package.
* Packages under executors/ and plugins/ (and the new-executor template) import thunder_core
  only as ``thunder_core``, ``thunder_core.extend`` and ``thunder_core.plugins``; their tests may
  also use ``thunder_core.testing``.
* Inside the core, a module imports only modules of its own layer or lower ones (``LAYERS``),
  and no two modules import each other, directly or through others (function-level imports
  count: they run too).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import thunder_core

CORE = Path(thunder_core.__file__).parent
REPO = CORE.parent
UPWARD = ("thunder_executor_", "thunder_plugin_")
SURFACE = {"thunder_core", "thunder_core.extend", "thunder_core.plugins"}

# Lowest first. A module's layer is that of its longest matching prefix.
LAYERS = [
    ("_version", "errors", "progress", "disk_cache"),
    ("ir",),
    ("ops",),
    ("capture",),
    ("autodiff", "transforms", "batching", "batching_prims", "batching_autograd", "forward_mode"),
    ("plugins.errors", "plugins.hookspecs", "plugins.probes", "plugins.config"),
    ("executors",),
    ("plugins",),
    ("jit", "dynamo"),
    ("inspection", "explain", "examine", "repro", "report", "functional"),
    ("extend", "testing", "cli", "templates", "__main__", ""),
]


def imported_modules(source: str, package: str) -> list[str]:
    """Every module an import statement names (``from a import b`` names ``a`` and ``a.b``)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def _core_modules() -> dict[str, Path]:
    modules = {}
    for path in CORE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    return modules


def test_core_modules_import_no_executor_or_plugin_package():
    offenders = []
    for name, path in _core_modules().items():
        offenders += [
            f"{name}: {m}" for m in imported_modules(path.read_text(), name) if m.startswith(UPWARD)
        ]
    assert not offenders


def _package_sources():
    for folder in ("executors", "plugins"):
        for path in (REPO / folder).glob("*/**/*.py"):
            if ".egg-info" not in str(path) and "build" not in path.parts:
                yield path, "tests" in path.relative_to(REPO).parts
    for path in (CORE / "templates" / "executor").rglob("*.py.tmpl"):
        yield path, "tests" in path.parts


def test_packages_import_only_the_public_surface():
    offenders = []
    for path, is_test in _package_sources():
        source = re.sub(r"\{\{\w+\}\}", "placeholder", path.read_text())
        for module in imported_modules(source, "plugin"):
            if not module.startswith("thunder_core") or module in SURFACE:
                continue
            if not _is_core_module(module) and module.rsplit(".", 1)[0] in SURFACE:
                continue  # a name imported from the surface: ``from thunder_core.extend import Symbol``
            if is_test and (module == "thunder_core.testing" or module.startswith("thunder_core.testing.")):
                continue
            offenders.append(f"{path.relative_to(REPO)}: {module}")
    assert not offenders, "packages must import thunder_core through its public surface:\n" + "\n".join(
        offenders
    )


def _is_core_module(module: str) -> bool:
    return module in _core_modules()


def _layer(module: str) -> int:
    short = module.removeprefix("thunder_core").removeprefix(".")
    best, rank = -1, len(LAYERS) - 1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (short == prefix or short.startswith(prefix + ".") or prefix == "") and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def _core_graph() -> dict[str, set[str]]:
    modules = _core_modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for statement_target in imported_modules(path.read_text(), package):
            if statement_target in modules and statement_target != name:
                graph[name].add(statement_target)
    # ``from pkg import submodule`` imports the submodule, not (only) the package's names:
    for targets in graph.values():
        for target in list(targets):
            if any(t.startswith(target + ".") for t in targets) and modules[target].name == "__init__.py":
                targets.discard(target)
    return graph


def test_the_core_imports_downward_only():
    upward = [
        f"{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})"
        for name, targets in _core_graph().items()
        for target in sorted(targets)
        if _layer(target) > _layer(name)
    ]
    assert not upward, "\n".join(upward)


def test_the_core_has_no_import_cycles():
    graph = _core_graph()
    cycles, index, low, stack, on_stack, counter = [], {}, {}, [], set(), [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in _core_modules():
        if v not in index:
            visit(v)
    assert not cycles, cycles
