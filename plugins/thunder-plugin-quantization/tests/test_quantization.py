"""quantize-int8 / quantize-int4 on litgpt GPT (small config, random weights).

References: the float32 model (within the stated relative error of each format) and, exactly
up to rounding, eager PyTorch on the same model with every quantized weight replaced by its
dequantized float value.
"""

from __future__ import annotations

import copy

import pytest
import torch
from thunder_plugin_quantization import kernels, report

import thunder_core
from thunder_core.testing.models import small_litgpt

# Relative error of the logits (Frobenius norm) against the float32 model, stated in the README.
STATED_ERROR = {"int8": 0.01, "int4": 0.08}
MEMORY_LIMIT = {"int8": 0.3, "int4": 0.17}
TORCH_ONLY = ["torch"]  # the low-bit kernels are the plugin's; fusion executors are not under test


def _model():
    torch.manual_seed(0)
    return small_litgpt(n_layer=2, n_embd=128, vocab=256, block_size=64).eval()


def _tokens():
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


def _dequantized_copy(original, quantized_model, kind: str, group_size: int = 64):
    """Eager reference: ``original`` with each quantized layer's weight set to its dequantized value."""
    reference = copy.deepcopy(original)
    modules = dict(quantized_model.named_modules())
    for name, layer in reference.named_modules():
        if name in modules and isinstance(layer, torch.nn.Linear) and "weight" in modules[name]._buffers:
            q = modules[name]
            if kind == "int8":
                w = kernels.dequantize_int8(q.weight, q.weight_scale)
            else:
                shape = (layer.out_features, layer.in_features)
                w = kernels.dequantize_int4(q.weight, q.weight_scales_and_zeros, group_size, shape)
            layer.weight.data = w
    return reference


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_logits_memory_and_the_kernels_in_the_final_trace(kind):
    model = _model()
    idx = _tokens()
    with torch.no_grad():
        float_logits = model(idx)
    quantized = copy.deepcopy(model)
    float_bytes = {
        n: m.weight.numel() * 4 for n, m in quantized.named_modules() if isinstance(m, torch.nn.Linear)
    }
    jitted = thunder_core.jit(quantized, plugins=[f"quantize-{kind}"], executors=TORCH_ONLY)
    with torch.no_grad():
        logits = jitted(idx)

    done = report(jitted)
    assert len(done.quantized) == 10 and set(done.skipped) == {"lm_head"}  # the LM head is skipped by default
    layers = dict(quantized.named_modules())
    held = sum(b.numel() * b.element_size() for n in done.quantized for b in layers[n].buffers(recurse=False))
    assert held <= MEMORY_LIMIT[kind] * sum(float_bytes[n] for n in done.quantized)
    assert not any(isinstance(p, torch.nn.Parameter) and p.dtype == torch.float32 for n in done.quantized
                   for p in layers[n].parameters(recurse=False))  # fmt: skip

    error = ((logits - float_logits).norm() / float_logits.norm()).item()
    assert error < STATED_ERROR[kind]
    with torch.no_grad():
        exact = _dequantized_copy(model, quantized, kind)(idx)
    torch.testing.assert_close(logits, exact, rtol=1e-4, atol=1e-4)

    final = [b.symbol.name for b in thunder_core.last_traces(jitted)[-1].bound_symbols]
    assert final.count(f"quant_{kind}_linear") == 10  # every quantized matmul runs the low-bit kernel
    assert final.count("linear") == 1  # the LM head, left in float32
    assert not any(name.startswith("quant_dequantize") for name in final)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_gradients_flow_through_quantized_layers_to_the_float_parameters(kind):
    model = _model().train()
    idx = _tokens()
    quantized = copy.deepcopy(model)
    jitted = thunder_core.jit(quantized, plugins=[f"quantize-{kind}"], executors=TORCH_ONLY)
    jitted(idx).logsumexp(-1).mean().backward()
    reference = _dequantized_copy(model, quantized, kind)
    reference(idx).logsumexp(-1).mean().backward()
    for name, param in quantized.named_parameters():
        torch.testing.assert_close(
            param.grad, dict(reference.named_parameters())[name].grad, rtol=1e-4, atol=1e-5
        )


def test_decoding_with_the_kv_cache_matches_the_dequantized_model_token_for_token():
    model = _model()
    quantized = copy.deepcopy(model)
    jitted = thunder_core.jit(quantized, plugins=["quantize-int8"], executors=TORCH_ONLY)
    reference = _dequantized_copy(model, quantized, "int8")

    def greedy(m, steps=12):
        m.set_kv_cache(batch_size=1)
        prompt = _tokens()[:1, :8]
        pos = torch.arange(8)
        token = m(prompt, pos)[:, -1].argmax(-1, keepdim=True)
        out = [int(token)]
        for _ in range(steps):
            pos = pos[-1:] + 1
            token = m(token, pos)[:, -1].argmax(-1, keepdim=True)
            out.append(int(token))
        return out

    with torch.no_grad():
        assert greedy(jitted) == greedy(reference)
    assert thunder_core.cache_info(jitted).entries == 2  # prefill and one decode step, nothing per position


def test_skip_patterns_and_layers_that_cannot_be_quantized_are_reported():
    model = _model()
    jitted = thunder_core.jit(
        model,
        plugins=["quantize-int4"],
        options={"quantize-int4": {"skip": ["transformer.h.0.*"], "group_size": 256}},
        executors=TORCH_ONLY,
    )
    done = report(jitted)
    assert all(name.startswith("transformer.h.0.") or "multiple of group_size 256" in reason
               for name, reason in done.skipped.items())  # fmt: skip
    assert done.quantized == ["transformer.h.1.mlp.proj"]  # the one layer with 256 input features
    assert "multiple of group_size 256" in done.skipped["lm_head"]  # the default skip list was replaced
    with torch.no_grad():
        jitted(_tokens())  # what is left in float still runs


def test_a_wrong_group_size_is_a_clear_error():
    with pytest.raises(thunder_core.ConfigError, match="group_size must be one of"):
        thunder_core.jit(_model(), plugins=["quantize-int4"], options={"quantize-int4": {"group_size": 48}})


@pytest.mark.parametrize("shape", [(64, 64), (192, 128), (512, 256), (128, 512)])
def test_one_row_kernels_read_the_packed_weights_like_the_aten_kernels(shape):
    from thunder_plugin_quantization import one_row

    if not one_row.AVAILABLE:
        pytest.skip("numba is not installed: one row runs on the ATen kernels")
    torch.manual_seed(0)
    weight, x = torch.randn(shape), torch.randn(1, shape[1])
    q, scale = kernels.quantize_int8(weight)
    packed, scales_and_zeros = kernels.quantize_int4(weight, 64)
    assert one_row.applies(x, shape[0], "int8")
    torch.testing.assert_close(
        one_row.int8(x, q, scale), torch._weight_int8pack_mm(x, q, scale), rtol=1e-5, atol=1e-5
    )
    expected = torch._weight_int4pack_mm_for_cpu(x, packed, 64, scales_and_zeros)
    # The plugin's int4 matmul equals ATen's on every machine: the one-row kernel where this CPU
    # packs in the layout it reads, ATen's kernel where it does not.
    torch.testing.assert_close(
        kernels.int4_matmul(x, packed, scales_and_zeros, 64, shape[0]), expected, rtol=1e-5, atol=1e-4
    )
    if not one_row.int4_layout_is_known():
        assert not one_row.applies(x, shape[0], "int4")
        pytest.skip("this CPU packs int4 in another layout (not AVX-512's): the ATen kernel runs")
    assert one_row.applies(x, shape[0], "int4")
    torch.testing.assert_close(one_row.int4(x, packed, scales_and_zeros, 64), expected, rtol=1e-5, atol=1e-4)
    assert not one_row.applies(x, 80, "int4")  # a partial block of 64 rows: the ATen kernel
    assert not one_row.applies(torch.randn(2, shape[1]), shape[0], "int8")  # two rows: the ATen kernel


def test_layers_on_a_device_without_the_kernels_stay_float_with_the_reason():
    from thunder_plugin_quantization.quantize import quantize_module

    for kind, options, reason in (
        ("int8", {"skip": []}, "no _weight_int8pack_mm kernel"),
        ("int4", {"skip": [], "group_size": 64}, "no _weight_int4pack_mm kernel"),
    ):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64)).to("meta")
        extension = quantize_module(model, kind, options)
        assert extension.report.quantized == [] and reason in extension.report.skipped["0"]
        assert isinstance(model[0].weight, torch.nn.Parameter)  # left as it was


def test_the_packing_check_of_the_cuda_path_accepts_a_right_packing_and_refuses_a_wrong_one():
    """The check the CUDA int4 path runs on every layer before using it, exercised with the CPU layout."""
    torch.manual_seed(0)
    weight, other = torch.randn(128, 128), torch.randn(128, 128)
    packed, scales_and_zeros = kernels.quantize_int4(weight, 64)
    assert kernels.check_int4_cuda(weight, packed, scales_and_zeros, 64)
    wrong, _ = kernels.quantize_int4(other, 64)
    assert not kernels.check_int4_cuda(weight, wrong, scales_and_zeros, 64)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_float_checkpoint_loads_into_the_quantized_model(kind):
    """Its float weights are quantized (a copy into the int8 buffer would cast them silently)."""
    trained = _model()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    idx = _tokens()
    jitted = thunder_core.jit(_model(), plugins=[f"quantize-{kind}"], executors=TORCH_ONLY)
    jitted.load_state_dict(trained.state_dict())
    expected = thunder_core.jit(copy.deepcopy(trained), plugins=[f"quantize-{kind}"], executors=TORCH_ONLY)
    with torch.no_grad():
        torch.testing.assert_close(jitted(idx), expected(idx))
        float_logits = trained(idx)
        error = ((jitted(idx) - float_logits).norm() / float_logits.norm()).item()
    assert error < STATED_ERROR[kind]


def test_int4_rows_are_padded_to_whole_blocks_and_the_padding_is_dropped():
    """A layer whose outputs are not a multiple of 64 is padded, so one row runs the Numba kernel."""
    torch.manual_seed(0)
    weight, x = torch.randn(100, 128), torch.randn(1, 128)
    packed, scales_and_zeros = kernels.quantize_int4(weight, 64)
    assert scales_and_zeros.shape[1] == 128  # 100 rows padded to two blocks of 64
    out = kernels.int4_matmul(x, packed, scales_and_zeros, 64, 100)
    dequantized = kernels.dequantize_int4(packed, scales_and_zeros, 64, (100, 128))
    assert out.shape == (1, 100) and dequantized.shape == (100, 128)
    torch.testing.assert_close(out, x @ dequantized.t(), rtol=1e-4, atol=1e-4)
    two_rows = torch.randn(2, 128)  # the ATen kernel, padding dropped the same way
    torch.testing.assert_close(
        kernels.int4_matmul(two_rows, packed, scales_and_zeros, 64, 100),
        two_rows @ dequantized.t(),
        rtol=1e-4,
        atol=1e-4,
    )
