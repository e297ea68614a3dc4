"""The backends the benchmarks compare, named on their command lines::

eager
torch.compile                              # Inductor, default mode
torch.compile(max-autotune-no-cudagraphs)  # any torch.compile mode in parentheses
torch.compile(backend=thunder_core)        # thunder_core behind Dynamo
thunder_core                               # the default executors (every installed one)
thunder_core[torch]                        # only these executors, in this claim order
thunder_core[inductor(regions=maximal)+numba]   # with executor options
thunder_core[inductor+numba]/checkpoint    # with plugins
thunder_core/select=priority               # the claim order decides, without measuring
thunder_core/dynamic=true                  # every size symbolic from the first call
thunder_core/background=always             # compile_in_background="always" (or never)
thunder_core/regions=maximal               # the Inductor executor's regions="maximal" (matmuls and attention too)
thunder_core/cpp_wrapper=true              # the Inductor executor's cpp_wrapper=True (a region's call path in C++)
torch.compile/dynamic=true                 # torch.compile(dynamic=True); also with a backend or mode
torch.compile(backend=thunder_core)/background=always   # options={"compile_in_background": "always"}
torch.compile(backend=thunder_core)/regions=maximal     # options={"options": {"inductor": {"regions": "maximal"}}}
torch.compile(backend=thunder_core)/cpp_wrapper=true    # options={"options": {"inductor": {"cpp_wrapper": True}}}
"""

from __future__ import annotations

import re

INDUCTOR_SETTINGS = ("regions", "cpp_wrapper")  # the Inductor executor's options a spec may set
_EXECUTOR = re.compile(r"^(?P<name>[\w-]+)(?:\((?P<options>[^)]*)\))?$")


def _value(text: str):
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


def thunder_core_arguments(spec: str) -> dict:
    """``jit`` keyword arguments for a ``thunder_core[...]/...`` spec."""
    head, _, tail = spec.partition("/")
    executors = options = None
    inside = head.removeprefix("thunder_core")
    if inside:
        if not (inside.startswith("[") and inside.endswith("]")):
            raise ValueError(f"not a thunder_core backend: {spec!r}")
        executors, options = [], {}
        for part in inside[1:-1].split("+"):
            match = _EXECUTOR.match(part)
            if match is None:
                raise ValueError(f"bad executor {part!r} in {spec!r}")
            executors.append(match["name"])
            for item in filter(None, (match["options"] or "").split(";")):
                key, _, value = item.partition("=")
                options.setdefault(match["name"], {})[key] = _value(value)
    plugins, settings = [], {}
    names = {"select": "select", "dynamic": "dynamic", "background": "compile_in_background"}
    for item in filter(None, tail.split("+")):
        key, equals, value = item.partition("=")
        if equals and key in names:
            settings[names[key]] = _value(value)
        elif equals and key in INDUCTOR_SETTINGS:
            options = options or {}
            options.setdefault("inductor", {})[key] = _value(value)
        else:
            plugins.append(item)
    return {"executors": executors, "options": options or None, "plugins": plugins or None, **settings}


def torch_compile_arguments(spec: str) -> dict:
    """``torch.compile`` keyword arguments for a ``torch.compile...`` spec."""
    head, _, tail = spec.partition("/")
    inside = head.removeprefix("torch.compile")
    arguments: dict = {}
    if inside == "(backend=thunder_core)":
        arguments["backend"] = "thunder_core"
    elif inside:
        if not (inside.startswith("(") and inside.endswith(")")):
            raise ValueError(f"not a torch.compile backend: {spec!r}")
        arguments["mode"] = inside[1:-1]
    for item in filter(None, tail.split("+")):
        key, _, value = item.partition("=")
        if key == "background" and arguments.get("backend") == "thunder_core":
            arguments.setdefault("options", {})["compile_in_background"] = value
        elif key == "dynamic":
            arguments["dynamic"] = _value(value)
        elif key in INDUCTOR_SETTINGS and arguments.get("backend") == "thunder_core":
            inductor = (
                arguments.setdefault("options", {}).setdefault("options", {}).setdefault("inductor", {})
            )
            inductor[key] = _value(value)
        else:
            raise ValueError(
                f"{item!r} is not a setting of {head!r} (dynamic=..., and background=..., regions=... or "
                "cpp_wrapper=... with thunder_core)"
            )
    return arguments


def wrap_forward(model, spec: str) -> None:
    """Compile ``model.forward`` in place, the way Hugging Face documents it for ``generate``."""
    import torch

    if spec == "eager":
        return
    if spec.startswith("torch.compile"):
        model.forward = torch.compile(model.forward, **torch_compile_arguments(spec))
    else:
        import thunder_core

        model.forward = thunder_core.jit(model.forward, **thunder_core_arguments(spec))


def wrap(model, spec: str):
    """``model`` as the backend ``spec`` runs it."""
    import torch

    if spec == "eager":
        return model
    if spec.startswith("torch.compile"):
        return torch.compile(model, **torch_compile_arguments(spec))
    import thunder_core

    return thunder_core.jit(model, **thunder_core_arguments(spec))
