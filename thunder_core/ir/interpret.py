"""The reference evaluator: the executable meaning of a trace."""

from __future__ import annotations

from thunder_core.ir.proxies import PROXY_TYPES
from thunder_core.ir.trace import Trace
from thunder_core.ir.tree import leaves, tree_map


def _bind(env: dict, pattern, value) -> None:
    if isinstance(pattern, PROXY_TYPES):
        env[pattern.name] = value
    elif isinstance(pattern, (tuple, list)):
        for p, v in zip(pattern, value):
            _bind(env, p, v)


def eval_trace(trace: Trace, *args, decompose: bool = False):
    """Run ``trace`` on real inputs with each symbol's reference ``impl``.

    With ``decompose=True`` every bound symbol that has subsymbols is evaluated through
    them instead, so the result checks the decompositions down to the prims.
    """
    env: dict = {}

    def read(x):
        return env[x.name] if isinstance(x, PROXY_TYPES) else x

    def run(bsyms) -> None:
        for bsym in bsyms:
            if bsym.symbol.name == "del":
                continue
            if decompose and bsym.subsymbols:
                run(bsym.subsymbols)
                continue
            result = bsym.symbol.impl(*tree_map(read, bsym.args), **tree_map(read, bsym.kwargs))
            _bind(env, bsym.output, result)

    for proxy, value in zip(trace.inputs, args):
        env[proxy.name] = value
    run(trace.bound_symbols)
    out = tree_map(read, trace.output)
    if trace.output_treespec is not None:
        from torch.utils._pytree import tree_unflatten

        return tree_unflatten(list(leaves(out)), trace.output_treespec)
    return out
