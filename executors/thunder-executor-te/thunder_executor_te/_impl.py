"""TransformerEngine linear, forward and backward, with per-layer FP8 state.

One ``te.Linear`` per weight tensor holds that layer's FP8 scaling state; it is built on the meta
device (TE supports deferred initialization), so it allocates no weight of its own, and its
parameters are the user's own tensors, swapped in for the call only — the table from weights to
layers holds its keys weakly and its values never reference them, so a freed weight frees its
layer. TE's autograd function runs the backward, through thunder_core's PyTorch-autograd
fallback. The ``fp8`` option reaches the executor per job (``with_options``).
"""

from __future__ import annotations

import weakref

import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format

from thunder_core.extend import OperatorExecutor, Symbol, autograd_fallback, get_symbol
from thunder_executor_te.checks import linear_checker

RECIPE = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
_FORMATS = {"hybrid": Format.HYBRID, "e4m3": Format.E4M3}


def _recipe(values: tuple | None) -> DelayedScaling:
    """A ``DelayedScaling`` from ``recipe.recipe_from``'s tuple (None: the default recipe)."""
    if values is None:
        return RECIPE
    given = dict(values)
    return DelayedScaling(
        fp8_format=_FORMATS[given["format"]],
        amax_history_len=given["amax_history_len"],
        amax_compute_algo=given["amax_compute_algo"],
        margin=given["margin"],
    )


_layers: weakref.WeakKeyDictionary[torch.Tensor, te.Linear] = weakref.WeakKeyDictionary()


def _layer(weight: torch.Tensor, has_bias: bool) -> te.Linear:
    layer = _layers.get(weight)
    if layer is None:
        out_features, in_features = weight.shape
        layer = te.Linear(in_features, out_features, bias=has_bias, params_dtype=weight.dtype, device="meta")
        _layers[weight] = layer
    return layer


def linear(x, weight, bias=None, *, fp8: bool = True, recipe: DelayedScaling = RECIPE):
    layer = _layer(weight, bias is not None)
    saved = dict(layer._parameters)
    layer._parameters["weight"] = weight
    if bias is not None:
        layer._parameters["bias"] = bias
    try:
        with te.fp8_autocast(enabled=fp8, fp8_recipe=recipe):
            return layer(x)
    finally:
        layer._parameters.update(saved)  # the layer keeps no reference to the user's weight


class TEExecutor(OperatorExecutor):
    """The TE linear executor; ``with_options`` gives the one for a job's options."""

    recipe: tuple | None = None

    def with_options(self, options: dict) -> OperatorExecutor:
        if self.name == "te_fp8":  # the fp8 plugin's: FP8 always, the job's recipe
            from thunder_executor_te.recipe import recipe_from

            return build_executor(fp8=True, recipe=recipe_from(options), name=self.name)
        return build_executor(fp8=options.get("fp8", True))


_executors: dict[tuple, OperatorExecutor] = {}


def build_executor(fp8: bool = True, recipe: tuple | None = None, name: str = "te") -> OperatorExecutor:
    key = (fp8, recipe, name)
    if key in _executors:
        return _executors[key]
    executor = _executors[key] = TEExecutor(
        name, version=te.__version__ if hasattr(te, "__version__") else None
    )
    executor.recipe = recipe
    capability = torch.cuda.get_device_capability()
    use_fp8 = fp8 and capability >= (8, 9)
    fp8_recipe = _recipe(recipe)

    def run(x, weight, bias=None):
        return linear(x, weight, bias, fp8=use_fp8, recipe=fp8_recipe)

    symbol = Symbol(f"{name}_linear", run, f"{name}_linear")
    executor.register_implementation(
        get_symbol("linear"), run, checker=linear_checker(capability, use_fp8), grad=autograd_fallback(symbol)
    )
    return executor
