"""thunder-plugin-cudagraphs: the ``reduce-overhead`` plugin, CUDA graphs around the lowered trace.

    jitted = thunder_core.jit(model, plugins=["reduce-overhead"])

Each run of graph-safe operations of the executed forward and backward becomes one
``cudagraph_k`` call (``graphs.partition``). On CUDA tensors it captures a CUDA graph on its
first call for each input layout (a graph per cache entry and shape) and replays it on later
calls, copying the inputs into the graph's static buffers and returning copies of its outputs
(so a later replay never overwrites a result still in use). Unavailable, with the reason, where
there is no CUDA device.
"""

from __future__ import annotations

from thunder_core.plugins import hookimpl


@hookimpl
def thunder_core_probe():
    from thunder_core.extend import availability, cuda_device

    return availability([cuda_device()], "run on a machine with an NVIDIA GPU and a CUDA build of torch")


@hookimpl
def thunder_core_declare_options(declare) -> None:
    declare("min_ops", int, 2, "the fewest operations worth a graph")
    declare("warmup", int, 2, "eager runs on a side stream before a graph is captured")


@hookimpl
def thunder_core_register_passes(register) -> None:
    from thunder_plugin_cudagraphs.graphs import use_cuda_graphs

    register("after_executors", use_cuda_graphs, name="cuda graphs")
