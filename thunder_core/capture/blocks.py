"""Recording the calls of a model's repeated blocks (transformer layers) as one bound symbol each.

A transformer is N copies of one block in an ``nn.ModuleList`` or ``nn.Sequential``. While a
module is captured, each call of such a block records a ``block`` bound symbol whose
subsymbols are the block's operations, so that later passes can transform and compile each
distinct block once (``thunder_core.jit.blocks``). Every block still runs its own Python
during capture: what a layer does may depend on its own attributes (``layer_idx``, a per-layer
flag), and only the recorded operations say whether two layers really are the same.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

from torch import nn

from thunder_core import progress
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


def _block_symbol(module: nn.Module) -> Symbol:
    name = type(module).__name__

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
        inner = _BlockRecorder(outer.namer, top_level=True)
        push_recorder(inner)
        try:
            out = forward(*args, **kwargs)
        finally:
            pop_recorder()
        inputs = free_inputs(inner.bound_symbols)
        produced = {p.name for b in inner.bound_symbols for p in b.flat_outputs()}
        returned = tuple(x for x in leaves(out) if isinstance(x, PROXY_TYPES) and x.name in produced)
        bsym = BoundSymbol(symbol, tuple(inputs), {}, returned, inner.bound_symbols, user_location())
        outer.bound_symbols.append(bsym)
        progress.count("blocks captured")
        return out

    return run


@contextmanager
def blocks_recorded(modules: list[nn.Module]):
    """Within the block, each call of one of ``modules`` made while capturing records a block."""
    patched = []
    try:
        for module in modules:
            module.forward = _recorded(module, module.forward, _block_symbol(module))
            patched.append(module)
        yield
    finally:
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
