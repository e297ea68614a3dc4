"""The one table of VJP rules, keyed by symbol.

A rule is called during the forward replay with the bound symbol's arguments (proxies).
It records the forward computation (usually the op itself, sometimes a variant that also
returns what backward needs) and returns ``(output, backward)``; ``backward(grad)`` is
called later, while the backward trace is recorded, and returns ``(input, grad)`` pairs.
Proxies a backward reads from the forward are what the forward saves. A rule raises
``NoRule`` for call forms it does not cover.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder_core.ir.symbols import Symbol

Rule = Callable[..., tuple]
_RULES: dict[Symbol, Rule] = {}


class NoRule(Exception):
    """This rule does not cover this call; differentiate the decomposition instead."""


class AutogradOnly(NoRule):
    """This call's gradient is one only PyTorch's autograd makes (a sparse gradient): neither
    the rule nor the decomposition, whose gradients are dense."""


def register_vjp(*symbols: Symbol) -> Callable[[Rule], Rule]:
    """Decorator registering ``rule`` as the VJP of each symbol."""

    def decorator(rule: Rule) -> Rule:
        for symbol in symbols:
            _RULES[symbol] = rule
        return rule

    return decorator


def vjp_rule(symbol: Symbol) -> Rule | None:
    rule = _RULES.get(symbol)
    return rule if rule is not None else symbol.vjp
