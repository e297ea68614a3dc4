"""scaled_dot_product_attention forward and backward through cuDNN frontend graphs.

Graphs are built once per (shapes, strides, dtype, scale, causal, training) and cached; a
call only binds tensors and executes. Training saves cuDNN's softmax statistics for the
backward graph.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math

import cudnn
import torch

from thunder_core.extend import OperatorExecutor, Symbol, get_symbol, new_tensor_proxy
from thunder_executor_cudnn.checks import in_layout_of, sdpa_checker, sdpa_stats_arguments

_FRONTEND_VERSION = importlib.metadata.version("nvidia-cudnn-frontend")

_CUDNN_TYPES = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}


@functools.cache
def _handle(device_index: int):
    return cudnn.create_handle()


def _graph(dtype, handle):
    kwargs = {} if handle is None else {"handle": handle}
    return cudnn.pygraph(
        io_data_type=_CUDNN_TYPES[dtype],
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        **kwargs,
    )


def _finalize(graph) -> None:
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()


def describe_forward(q_layout, k_layout, v_layout, dtype, scale, causal, training, handle=None):
    """The forward SDPA graph, described but not built into plans (needs no device without a handle)."""
    graph = _graph(dtype, handle)
    q, k, v = (graph.tensor(name=n, dim=list(s), stride=list(st), data_type=_CUDNN_TYPES[dtype])
               for n, (s, st) in zip("qkv", (q_layout, k_layout, v_layout)))  # fmt: skip
    o, stats = graph.sdpa(name="sdpa", q=q, k=k, v=v, attn_scale=scale, use_causal_mask=causal,
                          **sdpa_stats_arguments(_FRONTEND_VERSION, training))  # fmt: skip
    o.set_output(True).set_dim(list(q_layout[0])).set_stride(list(q_layout[1]))
    if training:
        stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    return graph, q, k, v, o, stats


@functools.lru_cache(maxsize=256)
def _forward_graph(q_layout, k_layout, v_layout, dtype, device_index, scale, causal, training):
    described = describe_forward(
        q_layout, k_layout, v_layout, dtype, scale, causal, training, handle=_handle(device_index)
    )
    _finalize(described[0])
    return described


@functools.lru_cache(maxsize=256)
def _backward_graph(q_layout, k_layout, v_layout, dtype, device_index, scale, causal):
    described = describe_backward(
        q_layout, k_layout, v_layout, dtype, scale, causal, handle=_handle(device_index)
    )
    _finalize(described[0])
    return described


def describe_backward(q_layout, k_layout, v_layout, dtype, scale, causal, handle=None):
    """The backward SDPA graph, described but not built into plans."""
    graph = _graph(dtype, handle)
    t = {n: graph.tensor(name=n, dim=list(s), stride=list(st), data_type=_CUDNN_TYPES[dtype])
         for n, (s, st) in zip(("q", "k", "v", "o", "do"), (q_layout, k_layout, v_layout, q_layout, q_layout))}  # fmt: skip
    b, h, s, _ = q_layout[0]
    stats = graph.tensor(
        name="stats", dim=[b, h, s, 1], stride=[h * s, s, 1, 1], data_type=cudnn.data_type.FLOAT
    )
    dq, dk, dv = graph.sdpa_backward(name="sdpa_backward", q=t["q"], k=t["k"], v=t["v"], o=t["o"], dO=t["do"],
                                     stats=stats, attn_scale=scale, use_causal_mask=causal)  # fmt: skip
    for grad, layout in ((dq, q_layout), (dk, k_layout), (dv, v_layout)):
        grad.set_output(True).set_dim(list(layout[0])).set_stride(list(layout[1]))
    return graph, t, stats, dq, dk, dv


def _layout(x: torch.Tensor):
    return tuple(x.shape), tuple(x.stride())


def _execute(graph, pack, device) -> None:
    """Run on torch's current stream (bound at every call: the stream may differ from build time)."""
    handle = _handle(device.index or 0)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute(pack, workspace, handle=handle)


def sdpa_forward(q, k, v, scale: float, causal: bool, training: bool):
    graph, tq, tk, tv, to, tstats = _forward_graph(
        _layout(q), _layout(k), _layout(v), q.dtype, q.device.index or 0, scale, causal, training
    )
    out = torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device=q.device)
    pack = {tq: q, tk: k, tv: v, to: out}
    stats = None
    if training:
        stats = torch.empty(q.shape[0], q.shape[1], q.shape[2], 1, dtype=torch.float32, device=q.device)
        pack[tstats] = stats
    _execute(graph, pack, q.device)
    return out, stats


def sdpa_backward(grad, q, k, v, out, stats, scale: float, causal: bool):
    grad = in_layout_of(grad, out)  # the graph's dO has the output's strides
    graph, t, tstats, tdq, tdk, tdv = _backward_graph(
        _layout(q), _layout(k), _layout(v), q.dtype, q.device.index or 0, scale, causal
    )
    dq, dk, dv = (torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device) for x in (q, k, v))
    pack = {
        t["q"]: q,
        t["k"]: k,
        t["v"]: v,
        t["o"]: out,
        t["do"]: grad,
        tstats: stats,
        tdq: dq,
        tdk: dk,
        tdv: dv,
    }
    _execute(graph, pack, q.device)
    return dq, dk, dv


def _forward_meta(q, k, v, scale, causal, training):
    out = new_tensor_proxy(q.shape, q.dtype, q.device, strides=q.stride())
    stats = (
        new_tensor_proxy((q.shape[0], q.shape[1], q.shape[2], 1), torch.float32, q.device)
        if training
        else None
    )
    return out, stats


def _backward_meta(grad, q, k, v, out, stats, scale, causal):
    return tuple(new_tensor_proxy(x.shape, x.dtype, x.device, strides=x.stride()) for x in (q, k, v))


forward_symbol = Symbol("cudnn_sdpa_forward", sdpa_forward, "cudnn_sdpa_forward", meta=_forward_meta)
backward_symbol = Symbol("cudnn_sdpa_backward", sdpa_backward, "cudnn_sdpa_backward", meta=_backward_meta)


def _scale(q, scale):
    return 1 / math.sqrt(q.shape[-1]) if scale is None else scale


def inference(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return sdpa_forward(q, k, v, _scale(q, scale), is_causal, False)[0]


def vjp(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    scale = _scale(q, scale)
    out, stats = forward_symbol(q, k, v, scale, is_causal, True)

    def backward(g):
        dq, dk, dv = backward_symbol(g, q, k, v, out, stats, scale, is_causal)
        return [(q, dq), (k, dk), (v, dv)]

    return out, backward


def build_executor() -> OperatorExecutor:
    executor = OperatorExecutor("cudnn", version=str(cudnn.backend_version()))
    checker = sdpa_checker(torch.cuda.get_device_capability())
    executor.register_implementation(
        get_symbol("scaled_dot_product_attention"), inference, checker=checker, grad=vjp
    )
    executor.register_implementation(forward_symbol, sdpa_forward)
    executor.register_implementation(backward_symbol, sdpa_backward)
    return executor
