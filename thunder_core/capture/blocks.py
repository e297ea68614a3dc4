"""Recording the calls of a model's repeated blocks (transformer layers) as one bound symbol each.

A transformer is N copies of one block in an ``nn.ModuleList`` or ``nn.Sequential``. While a
module is captured, each call of such a block records a ``block`` bound symbol whose
subsymbols are the block's operations, so that later passes can transform and compile each
distinct block once (``thunder_core.jit.blocks``). Each block runs its own Python during
capture, unless the capture reuses blocks (``jit(model, capture_blocks_once=True)``): then a
block whose call would do exactly what an earlier block's call did (the same class, state,
arguments and ambient state: see ``thunder_core.capture.block_reuse``) does not run its Python,
and the earlier call's operations are copied onto its own tensors. The recorded operations
still decide later which calls are compiled as one block.
"""

from __future__ import annotations

import contextvars
from collections import Counter
from contextlib import contextmanager

from torch import nn

from thunder_core import progress
from thunder_core.capture.block_reuse import BlockTemplates
from thunder_core.capture.recorder import Recorder
from thunder_core.ir.proxies import PROXY_TYPES
from thunder_core.ir.source import user_location
from thunder_core.ir.symbols import (
    BoundSymbol,
    Symbol,
    active_recorder,
    free_inputs,
    pop_recorder,
    push_recorder,
)
from thunder_core.ir.tree import leaves

BLOCK = "block"  # the tag of a recorded block call (its subsymbols are the block's operations)


def repeated_blocks(root: nn.Module) -> list[nn.Module]:
    """The children of ``ModuleList``/``Sequential`` containers that repeat: modules that have
    submodules of their own and whose class appears at least twice among their siblings."""
    found: list[nn.Module] = []
    seen: set[int] = set()
    for module in root.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = [c for c in module.children() if any(True for _ in c.children())]
        counts = Counter(type(c) for c in children)
        for child in children:
            if counts[type(child)] >= 2 and id(child) not in seen and "forward" not in vars(child):
                seen.add(id(child))
                found.append(child)
    return found


def block_symbol(name: str) -> Symbol:
    """The symbol of a recorded call of a block of class ``name`` (replaced before any trace runs)."""

    def unreachable(*args, **kwargs):
        raise RuntimeError("a recorded block call is replaced before the trace runs")

    return Symbol(name=BLOCK, impl=unreachable, printed_name=f"block_of_{name}", tags=frozenset({BLOCK}))


class _BlockRecorder(Recorder):
    in_block = True


def _recorded(module: nn.Module, forward, symbol: Symbol):
    def run(*args, **kwargs):
        outer = active_recorder()
        if outer is None or not outer.top_level or getattr(outer, "in_block", False):
            return forward(*args, **kwargs)
        templates = _templates.get()
        template = templates.matching(module, args, kwargs) if templates is not None else None
        if template is not None:  # the same block as one captured before: its Python need not run
            out, bound_symbols, inputs = templates.copy(template, module, args, kwargs, outer)
            progress.count("blocks reused")  # of the blocks captured: copied, their Python not run
        else:

            def record():
                inner = _BlockRecorder(outer.namer, top_level=True, grad_on_at_call=outer.grad_on_at_call)
                push_recorder(inner)
                try:
                    out = forward(*args, **kwargs)
                finally:
                    pop_recorder()
                return out, inner.bound_symbols, free_inputs(inner.bound_symbols)

            if templates is not None and templates.can_record(module):
                out, bound_symbols, inputs = templates.run_template(module, args, kwargs, record)
            else:
                out, bound_symbols, inputs = record()
        progress.count("blocks captured")
        produced = {p.name for b in bound_symbols for p in b.flat_outputs()}
        returned = tuple(x for x in leaves(out) if isinstance(x, PROXY_TYPES) and x.name in produced)
        outer.bound_symbols.append(
            BoundSymbol(symbol, tuple(inputs), {}, returned, bound_symbols, user_location())
        )
        return out

    run.records_a_block = True  # not an instance forward of the user's (block_reuse compares those)
    return run


_templates: contextvars.ContextVar[BlockTemplates | None] = contextvars.ContextVar(
    "thunder_core_block_templates", default=None
)


@contextmanager
def blocks_recorded(modules: list[nn.Module], *, reuse: bool = False):
    """Within the block, each call of one of ``modules`` made while capturing records a block;
    with ``reuse``, a call that would do what an earlier one did copies its operations
    (``thunder_core.capture.block_reuse``). Yields the capture's ``BlockTemplates``."""
    patched = []
    templates = BlockTemplates() if reuse else None
    token = _templates.set(templates)
    try:
        for module in modules:
            module.forward = _recorded(module, module.forward, block_symbol(type(module).__name__))
            patched.append(module)
        yield templates
    finally:
        _templates.reset(token)
        for module in patched:
            del module.forward


def inline_blocks(bound_symbols: list[BoundSymbol]) -> list[BoundSymbol]:
    """The bound symbols with every recorded block replaced by its operations."""
    out: list[BoundSymbol] = []
    for bsym in bound_symbols:
        if bsym.symbol.has_tag(BLOCK):
            out.extend(bsym.subsymbols)
        else:
            out.append(bsym)
    return out


def block_input_names(bound_symbols: list[BoundSymbol]) -> frozenset[str]:
    """The names of the tensors that entered each recorded block call (the layers' inputs)."""
    return frozenset(
        p.name for b in bound_symbols if b.symbol.has_tag(BLOCK) for p in b.flat_args() if hasattr(p, "shape")
    )


def has_blocks(bound_symbols: list[BoundSymbol]) -> bool:
    return any(b.symbol.has_tag(BLOCK) for b in bound_symbols)
