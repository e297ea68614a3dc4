"""Reproducers: a standalone script that runs one region (or one trace) with one executor.

``save_repro(compiled, path)`` writes, for a jitted function or module that has run, a script
holding the operations of a region as Python (thunder-core's own printed trace, with fused
regions opened up into their operations), random inputs of the recorded shapes, strides and
dtypes, the executor's name and options, and the failure if there was one. Run with only
thunder-core and that executor's package installed, it compiles the operations with that
executor alone in strict mode (so an executor failure raises instead of falling back to
torch) and compares the result with eager PyTorch.

When an executor fails while compiling or first running a region, the warning names a
reproducer written the same way (``THUNDER_CORE_REPRO_DIR`` picks the directory, ``off`` turns
them off; by default a new file in the system's temporary directory).
"""

from __future__ import annotations

import os
import pprint
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from thunder_core.errors import ThunderCoreError
from thunder_core.executors import failures
from thunder_core.inspection import _last_of_each
from thunder_core.ir.codegen import _NAMED_MODULES, trace_to_python
from thunder_core.ir.proxies import NumberProxy, TensorProxy
from thunder_core.ir.symbols import PROGRAM
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves

ENV = "THUNDER_CORE_REPRO_DIR"


class ReproError(ThunderCoreError):
    """A region that cannot be written as a standalone script."""


@dataclass
class _Region:
    name: str  # "inductor_fusion_1 of forward"
    executor: str
    bound_symbols: list
    output: object
    failure: str = ""


def save_repro(compiled, path: str | os.PathLike, *, region: str | None = None) -> Path:
    """Write a reproducer script for ``compiled`` (what ``thunder_core.jit`` returned, after a call).

    ``region`` names a region or operation of the executed traces as ``explain`` and the traces
    print it (``"inductor_fusion_1"``), or a whole executed trace (``"forward"``,
    ``"block_1_backward"``: its operations run by every executor of the job); without it, the
    region whose executor failed, else the whole first trace (unless it calls repeated blocks'
    programs: then name one). Returns the path.
    """
    entries = _last_of_each(compiled)
    job = None
    from thunder_core.inspection import _function, compile_report

    if compile_report(compiled) is None:
        job = _function(compiled)._job
    chosen = _choose(entries, region)
    executors = (
        [chosen.executor] if chosen.executor else (job.executor_names if job is not None else ["torch"])
    )
    options = (
        {name: dict(job.executor_options.get(name, {})) for name in executors} if job is not None else {}
    )
    source = repro_source(
        chosen.bound_symbols, chosen.output, executors, options, chosen.name, chosen.failure
    )
    path = Path(path)
    path.write_text(source)
    return path


def _executed_traces(entries) -> list[Trace]:
    traces = []
    for compiled in entries:
        for group in (compiled.traces, compiled.backward_traces):
            executed = [t for t in group if t.decisions]
            traces += executed[-1:]
        for block in compiled.blocks:
            for group in (block.traces, block.backward_traces):
                executed = [t for t in group if t.decisions]
                traces += executed[-1:]
    return traces


def _choose(entries, wanted: str | None) -> _Region:
    traces = _executed_traces(entries)
    regions = []
    for trace in traces:
        for bsym in trace.bound_symbols:
            if bsym.executor in (None, "python"):
                continue
            name = bsym.impl_name or bsym.symbol.name
            failure = getattr(bsym.impl, "failure", None) or ""
            regions.append(
                (
                    name,
                    _Region(f"{name} of {trace.function_name}", bsym.executor, [bsym], bsym.output, failure),
                )
            )
    whole = {t.function_name: t for t in reversed(traces)}  # the first trace of each name
    if wanted is not None:
        if wanted in whole:
            return _whole(whole[wanted])
        found = [r for name, r in regions if name == wanted or r.name == wanted]
        if not found:
            names = sorted({name for name, _ in regions})
            raise ReproError(
                f"no region, operation or trace named {wanted!r}; the executed traces are {sorted(whole)} "
                f"and have: {names}"
            )
        return found[0]
    failed = [r for _, r in regions if r.failure]
    if failed:
        return failed[0]
    trace = traces[0]
    calls = sorted({b.symbol.name for b in trace.bound_symbols if b.symbol.has_tag(PROGRAM)})
    if calls:
        raise ReproError(
            f"the {trace.function_name} trace calls the programs of repeated blocks ({', '.join(calls)}), "
            f"which cannot run standalone: name one trace (region= one of {sorted(whole)}) or a region"
        )
    return _whole(trace)


def _whole(trace) -> _Region:
    return _Region(f"the {trace.function_name} trace", "", list(trace.bound_symbols), trace.output)


def _printable(symbol) -> bool:
    """Whether generated code can call the symbol by its printed name (no executor object needed)."""
    name = symbol.printed_name
    return name.startswith("torch.") or name.split(".", 1)[0] in _NAMED_MODULES


def _operations(bound_symbols) -> list:
    """The operations, with fused regions opened up into theirs and no executor implementations."""
    ops = []
    for bsym in bound_symbols:
        if bsym.symbol.name == "del":
            continue
        if not _printable(bsym.symbol) and bsym.subsymbols:
            ops += _operations(bsym.subsymbols)
        else:
            ops.append(bsym.replace(impl=None, executor=None))
    return ops


def _inputs(ops, output) -> list:
    produced, inputs, seen = set(), [], set()
    for bsym in ops:
        for p in bsym.flat_args():
            if isinstance(p, (TensorProxy, NumberProxy)) and p.name not in produced and p.name not in seen:
                seen.add(p.name)
                inputs.append(p)
        produced |= {p.name for p in bsym.flat_outputs()}
    for p in leaves(output):
        if isinstance(p, (TensorProxy, NumberProxy)) and p.name not in produced and p.name not in seen:
            seen.add(p.name)
            inputs.append(p)
    return inputs


def _input_spec(p) -> dict:
    if isinstance(p, NumberProxy):
        if isinstance(p.value, torch.SymInt):
            raise ReproError(f"input {p.name} is a symbolic int; a reproducer needs the values of one call")
        return {"name": p.name, "value": p.value}
    if any(not isinstance(s, int) for s in (*p.shape, *p.stride())):
        raise ReproError(f"input {p.name} has symbolic sizes; a reproducer needs the sizes of one call")
    return {
        "name": p.name,
        "shape": list(p.shape),
        "stride": list(p.stride()),
        "dtype": str(p.dtype).removeprefix("torch."),
        "device": str(p.device),
        "requires_grad": bool(p.requires_grad),
    }


def repro_source(
    bound_symbols, output, executors: list[str], options: dict, title: str, failure: str = ""
) -> str:
    """The text of a reproducer script for ``bound_symbols`` (returning ``output``) run by ``executors``."""
    from thunder_core._version import __version__

    ops = _operations(bound_symbols)
    inputs = _inputs(ops, output)
    trace = Trace(inputs=inputs, bound_symbols=ops, output=output, function_name="region")
    code = trace_to_python(trace, subsymbol_depth=0)
    foreign = sorted(n for n in code.globals if n != "torch" and n not in _NAMED_MODULES)
    if foreign:
        raise ReproError(
            f"{title} uses objects that only exist in this process ({', '.join(foreign)}): it cannot run standalone"
        )
    body = code.source.split("\n\n\n", 1)[1] if "\n\n\n" in code.source else code.source
    imports = sorted(line for name, (_, line) in _NAMED_MODULES.items() if name in code.globals)
    packages = _packages(executors)
    lines = [
        f'"""thunder-core reproducer: {title}, run by {", ".join(executors)}.',
        "",
        *([f"Failure seen: {failure}", ""] if failure else []),
        "Needs thunder-core and the executor's package: "
        + (", ".join(packages) or "none beyond thunder-core")
        + ".",
        "Run `python THIS_FILE`: it compiles the operations below with those executors alone, in strict",
        "mode (an executor failure raises instead of falling back to torch), on random inputs of the",
        "recorded metadata, and compares the result with eager PyTorch.",
        f"Written by thunder-core {__version__} with torch {torch.__version__}.",
        '"""',
        "",
        "import os",
        "",
        'os.environ["THUNDER_CORE_STRICT"] = "1"  # an executor failure raises',
        "",
        "import torch",
        "",
        "import thunder_core",
        *imports,
        "",
        f"EXECUTORS = {executors!r}",
        f"OPTIONS = {pprint.pformat(options, sort_dicts=True)}",
        f"INPUTS = {pprint.pformat([_input_spec(p) for p in inputs], sort_dicts=False, width=120)}",
        "",
        "",
        body.rstrip(),
        "",
        "",
        _RUNNER,
    ]
    return "\n".join(lines)


def _packages(executors) -> list[str]:
    from thunder_core.plugins.manager import plugin_manager

    manager = plugin_manager()
    found = []
    for name in executors:
        info = manager.plugins.get(name)
        if info is not None and info.distribution:
            found.append(f"{info.distribution} {info.version or ''}".strip())
    return found


_RUNNER = """def random_inputs(seed: int = 0) -> list:
    generator = torch.Generator().manual_seed(seed)
    values = []
    for spec in INPUTS:
        if "value" in spec:
            values.append(spec["value"])
            continue
        dtype = getattr(torch, spec["dtype"])
        extent = 1 + sum((n - 1) * s for n, s in zip(spec["shape"], spec["stride"]) if n)
        if dtype.is_floating_point or dtype.is_complex:
            storage = torch.randn(extent, generator=generator).to(dtype)
        elif dtype == torch.bool:
            storage = torch.randint(0, 2, (extent,), generator=generator).bool()
        else:
            storage = torch.randint(0, 2, (extent,), generator=generator).to(dtype)
        x = torch.as_strided(storage, spec["shape"], spec["stride"]).to(spec["device"])
        values.append(x.requires_grad_(spec["requires_grad"]) if spec["requires_grad"] else x)
    return values


def main() -> None:
    jitted = thunder_core.jit(region, executors=EXECUTORS, options=OPTIONS or None, cache_dir=None)
    got = jitted(*random_inputs())
    expected = region(*random_inputs())
    torch.testing.assert_close(got, expected)
    print("the result matches eager PyTorch")


if __name__ == "__main__":
    main()
"""


def _repro_dir() -> str | None:
    value = os.environ.get(ENV, "")
    if value.lower() == "off":
        return None
    return value or tempfile.gettempdir()


def write_failure_repro(
    executor: str, bound_symbols, error: BaseException, options: dict | None
) -> str | None:
    """Write a reproducer for the operations an executor failed on; its path, or None (turned off,
    or the operations cannot run standalone)."""
    directory = _repro_dir()
    if directory is None or not bound_symbols:
        return None
    output = [p for b in bound_symbols for p in b.flat_outputs()]
    name = "_".join(sorted({b.impl_name or b.symbol.name for b in bound_symbols}))[:60]
    try:
        source = repro_source(
            bound_symbols,
            tuple(output),
            [executor],
            {executor: dict(options or {})},
            f"{executor} on {name}",
            f"{type(error).__name__}: {error}",
        )
        os.makedirs(directory, exist_ok=True)
        handle, path = tempfile.mkstemp(prefix=f"thunder_core_repro_{executor}_", suffix=".py", dir=directory)
        with os.fdopen(handle, "w") as file:
            file.write(source)
    except Exception:  # noqa: BLE001 - a reproducer is a convenience: never a second failure
        return None
    return path


failures.register_repro_writer(write_failure_repro)
