"""The ``tensor-parallel`` entry point: hooks only (see ``thunder_plugin_distributed.tensor_parallel``)."""

from __future__ import annotations

from thunder_core.plugins import hookimpl
from thunder_plugin_distributed.common import probe


@hookimpl
def thunder_core_probe():
    return probe()


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare(
        "column",
        str,
        "",
        "comma-separated fnmatch patterns of the nn.Linear layers to split by output features "
        "(empty, with row empty too: litgpt's and Llama-style models' attention and MLP projections)",
    )
    declare(
        "row", str, "", "comma-separated fnmatch patterns of the nn.Linear layers to split by input features"
    )
    declare(
        "sequence_parallel",
        bool,
        False,
        "keep the activations between the blocks split along the sequence (needs the model's head named lm_head)",
    )
    declare(
        "size",
        int,
        0,
        "ranks per tensor-parallel group (0: every rank); with fewer, consecutive ranks split the layers and "
        "fsdp or ddp, listed after tensor-parallel, work over the other dimension of the (data, tensor) mesh",
    )
    declare(
        "mesh",
        object,
        None,
        "from the Python API, in place of size: a ProcessGroup or 1-D DeviceMesh of the ranks that split the "
        "layers, or a 2-D DeviceMesh with mesh_dim_names ('data', 'tensor')",
    )
    declare(
        "broadcast", bool, True, "split the first rank's parameters (every rank starts from the same model)"
    )


@hookimpl
def thunder_core_register_module_transform(register) -> None:
    from thunder_plugin_distributed.tensor_parallel import tensor_parallel_transform

    register(tensor_parallel_transform, name="tensor-parallel")


@hookimpl
def thunder_core_register_passes(register) -> None:
    from thunder_plugin_distributed.schedule import schedule_collectives

    register("after_executors", schedule_collectives, name="schedule collectives")
