"""The FP8 recipe options of the ``fp8`` plugin, checked without importing TransformerEngine."""

from __future__ import annotations

from thunder_core.extend import ConfigError

FORMATS = ("hybrid", "e4m3")
AMAX_ALGORITHMS = ("max", "most_recent")
DEFAULTS = {"format": "hybrid", "amax_history_len": 16, "amax_compute_algo": "max", "margin": 0}


def declare_recipe_options(declare) -> None:
    declare(
        "format", str, DEFAULTS["format"], f"FP8 format: {FORMATS} (hybrid: E4M3 forward, E5M2 gradients)"
    )
    declare(
        "amax_history_len", int, DEFAULTS["amax_history_len"], "steps of amax history for the scaling factors"
    )
    declare(
        "amax_compute_algo",
        str,
        DEFAULTS["amax_compute_algo"],
        f"how the history becomes an amax: {AMAX_ALGORITHMS}",
    )
    declare("margin", int, DEFAULTS["margin"], "power-of-two margin of the scaling factors")


def recipe_from(options: dict) -> tuple:
    """The DelayedScaling arguments as a hashable tuple; a clear error for a value TE would refuse."""
    values = {key: options.get(key, default) for key, default in DEFAULTS.items()}
    if values["format"] not in FORMATS:
        raise ConfigError(f"fp8: format must be one of {FORMATS}, got {values['format']!r}")
    if values["amax_compute_algo"] not in AMAX_ALGORITHMS:
        raise ConfigError(
            f"fp8: amax_compute_algo must be one of {AMAX_ALGORITHMS}, got {values['amax_compute_algo']!r}"
        )
    if values["amax_history_len"] < 1 or values["margin"] < 0:
        raise ConfigError("fp8: amax_history_len must be at least 1 and margin at least 0")
    return tuple(sorted(values.items()))
