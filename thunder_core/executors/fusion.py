"""Grouping a fusion executor's claimed neighbours into regions, each compiled once."""

from __future__ import annotations

from collections.abc import Callable

import torch

from thunder_core import progress
from thunder_core.executors.background import COMPILE_LOCK, BackgroundCompile, in_background
from thunder_core.executors.failures import FirstCall, report_failure, strict
from thunder_core.executors.in_place import restartable, separate_written_inputs
from thunder_core.executors.regions import Region, RegionNotSupported
from thunder_core.executors.second_call import SecondCallCompile, at_second_call
from thunder_core.ir.proxies import PROXY_TYPES, NumberProxy, TensorProxy
from thunder_core.ir.symbolic import (
    SymbolicSizeError,
    hint,
    size_symbols,
    symbol_source,
    symbol_value,
    symbols_used_by,
)
from thunder_core.ir.symbols import (
    AUTOGRAD_FALLBACK,
    EFFECT,
    OPAQUE,
    PYTHON,
    BoundSymbol,
    Symbol,
    free_inputs,
    is_impure,
)
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves
from thunder_core.ops.shapes import VIEW_OPS, always_a_view

TORCH = "torch"  # the executor that takes back what a fusion executor gives back


def to_torch(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` run by the torch executor (the generated code calls the torch callable)."""
    return bsym.replace(executor=TORCH, impl=None)


def _last_uses(bsyms: list[BoundSymbol]) -> dict[str, int]:
    """Name -> the position of the last bound symbol that reads it."""
    last: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        for p in b.flat_args():
            last[p.name] = i
    return last


def _size_carriers(inputs) -> dict:
    """Size symbol -> the int inputs (taken symbolic) and plain tensors among a trace's
    ``inputs`` that give it (``symbolic.size_symbols``), in input order."""
    carriers: dict = {}
    for p in inputs:
        if type(p) is TensorProxy or type(p) is NumberProxy:
            for symbol, _, _ in size_symbols([p]):
                carriers.setdefault(symbol, []).append(p)
    return carriers


def _with_size_carriers(
    inputs: list, bsyms: list[BoundSymbol], carriers: dict, alive, symbols_as_ints: bool = False
) -> list:
    """``inputs``, plus an input of the whole trace for each size symbol the region's operations
    use and its own inputs do not give (``torch.arange(s0 + 1)`` over a mask whose length is
    another symbol): the region reads that size from it, as the program does, and so compiles
    once for every size instead of going back to torch. Of the inputs that give a symbol, one on
    the region's device that the program keeps anyway (``alive(name)``) is taken first, else
    the smallest (a backward frees its inputs after their last use). With ``symbols_as_ints``
    (``FusionExecutor.size_symbols_as_ints``), a symbol the inputs give only as a multiple plus a
    constant is also taken as an int input (``_symbols_as_ints``)."""
    if not carriers:
        return inputs
    used = symbols_used_by(bsyms)
    missing = used - {symbol for symbol, _, _ in size_symbols(inputs)}
    if not missing:
        return inputs + _symbols_as_ints(inputs, used) if symbols_as_ints else inputs
    devices = {p.device for p in inputs if isinstance(p, TensorProxy)}
    names = {p.name for p in inputs}
    extra = []
    for symbol in sorted(missing, key=str):
        candidates = carriers.get(symbol, ())
        numbers = [p for p in candidates if type(p) is NumberProxy]  # the int itself: no tensor to keep
        candidates = numbers or [p for p in candidates if not devices or p.device in devices]
        if not candidates:
            continue
        carrier = min(candidates, key=lambda p: (not alive(p.name), 0 if numbers else hint(p.numel())))
        if carrier.name not in names:
            names.add(carrier.name)
            extra.append(carrier)
    inputs = inputs + extra
    return inputs + _symbols_as_ints(inputs, used) if symbols_as_ints else inputs


def _symbols_as_ints(inputs: list, wanted: set) -> list:
    """An int input for each symbol in ``wanted`` that ``inputs`` give only as a multiple of it
    plus a constant (``g.shape[1]`` is ``s1 + 2`` in the backward of ``torch.cat([x, x[:, :2]], 1)``):
    a region compiler reads symbols from sizes that are exactly a symbol, so the region takes it
    as the int the program binds (``s1 = g.shape[1] - 2``), named as the symbol prints."""
    plain = {symbol for symbol, size, _ in size_symbols(inputs) if size.node.expr == symbol}
    names = {p.name for p in inputs}
    extra = []
    for symbol, size, _ in size_symbols(inputs):
        if symbol in wanted and symbol not in plain:
            value = symbol_value(symbol, size)
            if value is None:
                continue
            name = symbol_source(symbol, value)
            if name not in names:
                names.add(name)
                extra.append(NumberProxy(name, value))
    return extra


def _region(
    bsyms: list[BoundSymbol],
    position: int,
    last_uses: dict[str, int],
    read_after: set[str],
    carriers: dict | None = None,
    symbols_as_ints: bool = False,
) -> Region:
    """The region of ``bsyms`` ending before ``position``: what it reads, and what is used after
    it (read from ``position`` on, or named in ``read_after``: the trace's outputs, and what the
    operations deferred past the region read). ``carriers`` (``_size_carriers``) supply the
    sizes the region uses that its own inputs do not give (and, with ``symbols_as_ints``, the
    symbols they give only as sums, as ints)."""
    alive = lambda name: name in read_after or last_uses.get(name, -1) >= position  # noqa: E731
    inputs = _with_size_carriers(free_inputs(bsyms), bsyms, carriers or {}, alive, symbols_as_ints)
    # An input the region updates in place keeps its name and is the same tensor after it: not an output.
    outputs, out_seen = [], {p.name for p in inputs}
    for b in bsyms:
        for p in b.flat_outputs():
            used_later = p.name in read_after or last_uses.get(p.name, -1) >= position
            if used_later and p.name not in out_seen:
                out_seen.add(p.name)
                outputs.append(p)
    return Region(bsyms, inputs, outputs)


# Ops that are views when the argument's strides allow (else they copy, which a fused region does
# best); ``always_a_view`` says which are views whatever the strides.
_VIEWS_WHEN_VIEWABLE = frozenset({"view", "view_as", "reshape", "reshape_as", "flatten", "unflatten"})


def _is_view_of_argument(bsym: BoundSymbol) -> bool:
    """Does ``bsym`` return a view of its (first) tensor argument, as the trace's strides say?"""
    name = bsym.symbol.name
    outputs = bsym.flat_outputs()
    tensors = [p for p in bsym.flat_args() if isinstance(p, TensorProxy)]
    if len(outputs) != 1 or not isinstance(outputs[0], TensorProxy) or not tensors:
        return False
    if always_a_view(bsym):
        return True
    if name not in _VIEWS_WHEN_VIEWABLE:
        return False
    x = tensors[0]
    try:
        torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta").view(
            tuple(outputs[0].shape)
        )
    except RuntimeError:
        return False
    return True


def _views_after(run: list[BoundSymbol], outputs: list) -> list[BoundSymbol]:
    """The views in ``run`` that can run after its region instead: each makes a region output
    (or the argument of such a view) and nothing left in the region reads it."""
    needed = {p.name for p in outputs}
    moved: list[BoundSymbol] = []
    read_inside: dict[str, int] = {}
    for b in run:
        for p in b.flat_args():
            read_inside[p.name] = read_inside.get(p.name, 0) + 1
    for b in reversed(run):
        out = b.flat_outputs()
        if not _is_view_of_argument(b) or out[0].name not in needed or read_inside.get(out[0].name, 0):
            continue
        moved.insert(0, b)
        for p in b.flat_args():
            read_inside[p.name] -= 1
            if isinstance(p, TensorProxy):
                needed.add(p.name)
    return moved


def operations(bsyms: list[BoundSymbol]) -> str:
    """``torch.add, torch.mul, ...``: the operations of a region, for messages."""
    names = [b.symbol.printed_name for b in bsyms]
    return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")


def torch_fallback(region) -> Callable:
    """The region's operations run by the torch executor, as one callable that frees each
    intermediate after its last use (as the program around it does)."""
    from thunder_core.transforms.delete_last_used import delete_last_used

    bsyms = [to_torch(b) for b in region.bound_symbols]
    trace = Trace(region.inputs, bsyms, tuple(region.outputs), function_name="torch_fallback")
    return delete_last_used(trace).python_callable()


def _compile_region(executor, region: Region) -> Callable:
    """``executor.compile_region(region)``; a region that writes some of its inputs in place runs
    compiled only while they share no memory with its other inputs (``in_place.SeparateInputs``)."""
    return separate_written_inputs(executor.compile_region(region), region, lambda: torch_fallback(region))


def compile_now(executor, region: Region) -> Callable:
    """The region compiled (``_compile_region``), one at a time with the compiles running in the background."""
    progress.stage(f"compiling {executor.name} regions")
    if not executor.compiles_in_background:
        compiled = _compile_region(executor, region)
    else:
        with COMPILE_LOCK:
            compiled = _compile_region(executor, region)
    progress.count(f"{executor.name} regions")
    return compiled


def _compile(executor, region: Region, lasting: bool, bound_symbols: list[BoundSymbol]) -> Callable:
    """The region compiled now, on the worker thread while its torch operations run
    (``thunder_core.executors.background``), or before the program's second call
    (``thunder_core.executors.second_call``). A region with ``lasting`` effects (that running
    its torch operations first would not repeat exactly) compiles now."""
    calls = at_second_call()  # never set together with in_background()
    background = executor.compiles_in_background and in_background()
    if lasting or strict() or (calls is None and not background):
        return compile_now(executor, region)
    try:
        fallback = torch_fallback(region)
        if background:
            executor.prepare_compiles()
    except SymbolicSizeError as error:
        # Its code reads a size that its inputs do not carry: no executor can compile it apart.
        raise RegionNotSupported(f"{executor.name}: {error}") from error
    except Exception:  # noqa: BLE001 - the region cannot run as it is: its compile says why, now
        return compile_now(executor, region)
    if calls is not None:
        build = lambda: compile_now(executor, region)  # noqa: E731
        return SecondCallCompile(
            build, fallback, executor.name, region.inputs, bound_symbols, operations(bound_symbols), calls
        )
    return BackgroundCompile(
        lambda: _compile_region(executor, region), fallback, executor.name, region.inputs
    )


def _pure(bsym: BoundSymbol) -> bool:
    return not (is_impure(bsym) or any(is_impure(s) for s in bsym.subsymbols))


def _shape_ops_read_by(bsym: BoundSymbol, run: list[BoundSymbol], made_by_run: set[str]) -> list[BoundSymbol]:
    """The claims of ``run`` that ``bsym`` reads, with those they read in turn, in run order."""
    producer = {p.name: b for b in run for p in b.flat_outputs()}
    needed, stack = {}, [p.name for p in bsym.flat_args() if p.name in made_by_run]
    while stack:
        b = producer[stack.pop()]
        if id(b) not in needed:
            needed[id(b)] = b
            stack.extend(p.name for p in b.flat_args() if p.name in producer)
    return [b for b in run if id(b) in needed]


# What may move ahead of an open run: matmuls and views, which only read their arguments. Other
# operations may write to theirs without a tag saying so (batch_norm's running statistics in
# training, embedding's max_norm renormalization), so they stay where they are.
MOVABLE = frozenset({"matmul", "mm", "bmm", "linear"}) | VIEW_OPS


def _may_move(bsym: BoundSymbol, run: list[BoundSymbol]) -> bool:
    """May ``bsym`` (not claimed) change places with the open ``run``: run ahead of it, or wait
    until after its region? Only a matmul or a view, and only when neither it nor the run has an
    effect (in-place update, random draw, hook)."""
    if bsym.symbol.name not in MOVABLE or bsym.symbol.has_tag(PYTHON) or bsym.symbol.has_tag(OPAQUE):
        return False
    return not bsym.symbol.has_tag(AUTOGRAD_FALLBACK) and _pure(bsym) and all(_pure(b) for b in run)


def _ahead_of_run(bsym: BoundSymbol, run: list[BoundSymbol], made_by_run: set[str], executor):
    """What can run before the open ``run`` when ``bsym`` (not claimed by it) is met: None when
    the run must end first; else the run's claims to take out of it (often none) and ``bsym``.

    A matmul or a view that reads nothing the run computes moves ahead of it, and the claims on
    both sides of it still form one region, as in ``down(silu(gate(x)) * up(x))``, where the
    ``up`` matmul separates the SiLU from the product that consumes it. When it reads only shape
    ops of the run (the transposed weight a matmul takes), those leave the run with it: they
    cost nothing either way. Nothing else moves, and nothing moves across a run with an
    operation that has an effect (in-place update, random draw, hook).
    """
    if not _may_move(bsym, run):
        return None
    taken = _shape_ops_read_by(bsym, run, made_by_run)
    if taken and (len(taken) == len(run) or executor.region_weight(taken) != 0):
        return None
    return taken


def fuse_regions(trace: Trace, executor, min_region_size: int | None = None) -> Trace:
    """Replace each run of ``executor``'s claims by one compiled region.

    A run stays open across matmuls and views: one that reads nothing the run computes moves
    ahead of it (``_ahead_of_run``), so claims separated only by an independent matmul still
    fuse; one that reads what the run computes waits until after the region, unless a later
    claim reads it, so the claims after it that do not need it join the same region. In a backward, that puts
    the gradient products and the activation's derivative on both sides of a weight-gradient
    matmul into one pass over the saved activations.

    Post: ``result.given_back`` maps the output names of claims that went back to torch to why.
    """
    minimum = executor.min_region_size if min_region_size is None else min_region_size
    trace_outputs = {x.name for x in leaves(trace.output) if isinstance(x, PROXY_TYPES)}
    result: list[BoundSymbol] = []
    run: list[BoundSymbol] = []
    bsyms = trace.bound_symbols
    given_back: dict[str, str] = {}
    regions = 0
    last_uses = _last_uses(bsyms)
    carriers = _size_carriers(trace.inputs)

    def give_back(reason: str) -> None:
        for b in run:
            for p in b.flat_outputs():
                given_back[p.name] = reason
        result.extend(to_torch(b) for b in run)

    deferred: list[BoundSymbol] = []  # not claimed, waiting for the open run's region
    made_by_deferred: set[str] = set()

    def flush(position: int) -> None:
        emit_region(position)
        result.extend(deferred)
        deferred.clear()
        made_by_deferred.clear()

    def emit_region(position: int) -> None:
        nonlocal regions
        if not run:
            return
        weight = executor.region_weight(run)
        if weight < minimum:
            give_back(
                f"a region of {len(run)} op(s) of weight {weight} (shape-only ops weigh nothing) is below "
                f"{executor.name}'s min_region_size ({minimum})"
            )
        else:
            read_after = trace_outputs | {p.name for b in deferred for p in b.flat_args()}
            region = _region(
                list(run), position, last_uses, read_after, carriers, executor.size_symbols_as_ints
            )
            whole = list(run)  # what is given back if the region fails, the views moved after it included
            after: list[BoundSymbol] = []
            if executor.views_after_region:
                after = _views_after(run, region.outputs)
                if after and len(after) < len(run):
                    for b in after:
                        run.remove(b)
                    read_after = read_after | {p.name for b in after for p in b.flat_args()}
                    region = _region(
                        list(run), position, last_uses, read_after, carriers, executor.size_symbols_as_ints
                    )
                else:
                    after = []
            name = f"{executor.name}_fusion_{regions + 1}"
            impure = any(is_impure(b) for b in run)
            # Effects that running the operations again would not repeat exactly (in_place.restartable)
            # keep the region from falling back after a failed first run or compiling beside the program.
            lasting = impure and not restartable(run)
            try:
                compiled = _compile(executor, region, lasting, list(run))
            except RegionNotSupported as reason:
                run[:] = whole
                give_back(f"{executor.name} could not compile the region: {reason}")
                run.clear()
                return
            except Exception as error:
                run[:] = whole
                give_back(
                    report_failure(executor.name, "compiling a region", operations(run), error, list(run))
                )
                run.clear()
                return
            regions += 1
            fn = FirstCall(
                compiled,
                lambda region=region: torch_fallback(region),
                executor.name,
                operations(run),
                impure=lasting,
                bound_symbols=list(run),
            )
            tags = frozenset({EFFECT}) if impure else frozenset()
            symbol = Symbol(name=name, impl=fn, printed_name=name, tags=tags)
            out = tuple(region.outputs)
            result.append(
                BoundSymbol(symbol, tuple(region.inputs), {}, out, list(run), None, executor.name, fn, name)
            )
            for b in after:
                given_back.update(
                    (p.name, f"a view of a result of {executor.name}'s region, run after it")
                    for p in b.flat_outputs()
                )
                result.append(to_torch(b))
        run.clear()

    made_by_run: set[str] = set()  # names the open run computes

    def reads(bsym: BoundSymbol, names: set[str]) -> bool:
        return any(p.name in names for p in bsym.flat_args())

    for i, bsym in enumerate(bsyms):
        if bsym.executor == executor.name and bsym.impl is None:
            if run and (
                not executor.can_join(run, bsym)
                or reads(bsym, made_by_deferred)
                or (deferred and not _pure(bsym))
            ):
                flush(i)
                made_by_run.clear()
            run.append(bsym)
            made_by_run.update(p.name for p in bsym.flat_outputs())
            continue
        taken = None
        if run and not reads(bsym, made_by_deferred):
            taken = _ahead_of_run(bsym, run, made_by_run, executor)
        if taken is None and run and _may_move(bsym, run):  # it waits until after the region
            deferred.append(bsym)
            made_by_deferred.update(p.name for p in bsym.flat_outputs())
            continue
        if taken is None:
            flush(i)
            made_by_run.clear()
        else:  # these run ahead of the open run, which goes on after them
            for b in taken:
                run.remove(b)
                made_by_run.difference_update(p.name for p in b.flat_outputs())
                for p in b.flat_outputs():
                    given_back[p.name] = f"a shape op read outside {executor.name}'s region, run before it"
                result.append(to_torch(b))
        result.append(bsym)
    flush(len(bsyms))
    fused = trace.with_bound_symbols(result, trace.provenance)
    fused.given_back = given_back
    return fused
