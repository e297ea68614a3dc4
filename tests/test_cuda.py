"""Changing shapes, training and Hugging Face generate on a CUDA device, with the executors
installed: what the CPU tests check, on the device where Inductor writes Triton kernels and the
GPU executors (cudnn, cupy, ...) take part. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import warnings

import pytest
import torch
from models import greedy_generate, hf_llama, litgpt_gpt, token_batch

import thunder_core

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"
)
CLOSE = dict(rtol=1e-4, atol=1e-4)  # float32 kernels that sum in another order than eager's


def _ran(jfn) -> str:
    return str(thunder_core.explain(jfn))


def test_litgpt_forward_over_changing_prompt_lengths_compiles_twice_on_cuda():
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64, vocab=256, block_size=128).cuda().eval()
    jmodel = thunder_core.jit(model)
    with torch.no_grad():
        for length in (8, 16, 24, 40, 64, 9):
            idx = token_batch(1, length, seed=length).cuda()
            torch.testing.assert_close(jmodel(idx), model(idx), **CLOSE)
    info = thunder_core.cache_info(jmodel)
    assert info.entries == 2, info.reasons
    assert any("symbolic sizes" in reason for reason in info.reasons), info.reasons
    assert "inductor" in _ran(jmodel), _ran(jmodel)  # a symbolic region compiled for the device


def test_litgpt_training_over_sequence_lengths_gives_eagers_gradients_on_cuda():
    torch.manual_seed(0)
    model = litgpt_gpt(n_layer=2, n_embd=64, vocab=256, block_size=128).cuda()
    jmodel = thunder_core.jit(model)
    for length in (8, 16, 24, 40, 12):
        idx = token_batch(2, length, seed=length).cuda()
        jmodel(idx).logsumexp(-1).mean().backward()
        ours = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        model(idx).logsumexp(-1).mean().backward()
        for got, param in zip(ours, model.parameters()):
            torch.testing.assert_close(got, param.grad, **CLOSE)
        model.zero_grad(set_to_none=True)
    info = thunder_core.cache_info(jmodel)
    assert info.entries == 2, info.reasons


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hugging_face_generate_with_the_forward_jitted_gives_eagers_tokens_on_cuda(cache, dynamic):
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).cuda().eval()
    kwargs = {} if cache == "dynamic" else {"cache_implementation": "static"}
    prompts = [token_batch(1, 9, seed=1).cuda(), token_batch(1, 5, seed=2).cuda()]
    expected = [greedy_generate(model, p, **kwargs) for p in prompts]
    model.forward = thunder_core.jit(model.forward, dynamic=dynamic)
    with warnings.catch_warnings():
        # generate compiles the forward with torch.compile by itself for a static cache on CUDA:
        # the jitted forward must still run its program, not "eagerly, uncompiled"
        warnings.filterwarnings("error", ".*runs eagerly, uncompiled")
        for prompt, want in zip(prompts, expected):
            assert torch.equal(greedy_generate(model, prompt, **kwargs), want)
    info = thunder_core.cache_info(model.forward)
    assert info.hits + info.misses == 2 * 6, info  # a forward call per token, each thunder-core's
    assert info.entries <= 4, info.reasons  # not a compile per token


def test_hugging_face_generate_compiled_in_the_background_gives_eagers_tokens_on_cuda():
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).cuda().eval()
    prompts = [token_batch(1, 9, seed=1).cuda(), token_batch(1, 13, seed=2).cuda()]
    expected = [greedy_generate(model, p) for p in prompts]
    model.forward = thunder_core.jit(model.forward, dynamic=True, compile_in_background="always")
    for _ in range(2):  # the second time round, the regions compiled meanwhile run
        for prompt, want in zip(prompts, expected):
            assert torch.equal(greedy_generate(model, prompt), want)


@pytest.mark.parametrize("dynamic", [None, True])
def test_hugging_face_generate_through_the_torch_compile_front_end_on_cuda(dynamic):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).cuda().eval()
    prompts = [token_batch(1, 7, seed=3).cuda(), token_batch(1, 11, seed=4).cuda()]
    expected = [greedy_generate(model, p) for p in prompts]
    model.forward = torch.compile(model.forward, backend="thunder_core", dynamic=dynamic)
    for prompt, want in zip(prompts, expected):
        assert torch.equal(greedy_generate(model, prompt), want)
    assert "-> thunder_core" in _ran(model.forward), _ran(model.forward)
    torch._dynamo.reset()


def test_hugging_face_training_step_gives_eagers_gradients_on_cuda():
    torch.manual_seed(0)
    model = hf_llama(n_layer=2).cuda()
    jmodel = thunder_core.jit(model)
    for length in (9, 17):
        idx = token_batch(2, length, seed=length).cuda()
        jmodel(input_ids=idx, labels=idx).loss.backward()
        ours = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        model(input_ids=idx, labels=idx).loss.backward()
        for name, param in model.named_parameters():
            torch.testing.assert_close(ours[name], param.grad, **CLOSE, msg=name)
        model.zero_grad(set_to_none=True)
