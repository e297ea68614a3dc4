"""Autodiff: VJP rules per symbol, and the split of a trace into forward and backward traces."""

from thunder_core.autodiff.registry import NoRule, register_vjp, vjp_rule

__all__ = ["NoRule", "register_vjp", "vjp_rule"]
