"""thunder-plugin-autocast: mixed precision as a thunder-core trace transform.

Enable it per job: ``thunder_core.jit(model, plugins=["autocast"])``, optionally with
``options={"autocast": {"dtype": "float16"}}``.
"""

from __future__ import annotations

from thunder_core.plugins import hookimpl

DTYPES = ("bfloat16", "float16")


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("dtype", str, "bfloat16", f"the lower-precision dtype: one of {DTYPES}")


@hookimpl
def thunder_core_register_passes(register) -> None:
    from thunder_plugin_autocast.transform import autocast_pass

    register("after_capture", autocast_pass, name="autocast")
