"""Host-side checks of the CUDA the CuPy executor generates: every kernel of a litgpt training
step compiles with nvcc for sm_80 and sm_90 (no GPU needed; run by ``nox -s gpu-host-checks``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from thunder_executor_cupy.sources import (
    PRELUDE,
    elementwise_regions,
    kernel_source,
    kernel_sources,
    translation_unit,
)

import thunder_core
from thunder_core.testing.models import small_litgpt

NVCC = shutil.which("nvcc")


def _litgpt_traces() -> list:
    torch.manual_seed(0)
    model = small_litgpt()
    jitted = thunder_core.jit(model, executors=["torch"], reuse_blocks=False)
    idx = torch.randint(0, 128, (2, 17))
    logits = jitted(idx[:, :-1])
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1)).backward()
    backward = thunder_core.last_backward_traces(jitted)
    forward = [t for t in thunder_core.last_traces(jitted) if t not in backward]
    return [forward[-1], backward[-1]]


def _half_trace():
    jitted = thunder_core.jit(lambda x, y: torch.sigmoid(x * 2 + y) - torch.tanh(y), executors=["torch"])
    jitted(torch.randn(8, dtype=torch.float16), torch.randn(8, dtype=torch.float16))
    return thunder_core.last_traces(jitted)[-1]


@pytest.fixture(scope="module")
def sources() -> list[str]:
    found = [s for trace in _litgpt_traces() for s in kernel_sources(trace)]
    found += kernel_sources(_half_trace())
    return found


def test_a_training_step_gives_kernels_for_its_elementwise_runs(sources):
    assert len(sources) >= 5
    assert any("__half" in s for s in sources)  # float16 regions use CUDA's half type
    assert all(s.startswith('extern "C" __global__ void thunder_region(') for s in sources)


def test_the_wrapper_reads_one_element_inputs_as_raw_arrays():
    source = kernel_source("k", "float32 in0, raw float32 in1", "float32 out0", "out0 = in0 * in1[0];")
    assert "const float in0 = in0_ptr[i];" in source and "const float* in1 = in1_ptr;" in source
    assert "out0_ptr[i] = out0;" in source


def test_regions_end_at_operations_the_executor_does_not_fuse():
    def f(x, w):
        h = torch.exp(x) * 2 + 1
        return torch.tanh(h @ w) - 3  # the matmul ends a region

    jitted = thunder_core.jit(f, executors=["torch"])
    jitted(torch.randn(4, 4), torch.randn(4, 4))
    regions = elementwise_regions(thunder_core.last_traces(jitted)[-1])
    assert len(regions) == 2 and all("matmul" not in {b.symbol.name for b in ops} for ops, _, _ in regions)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed (CUDA source is compiled where it is)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_generated_kernel_compiles_with_nvcc(sources, tmp_path, arch):
    unit = tmp_path / f"kernels_{arch}.cu"
    unit.write_text(translation_unit(sources))
    done = subprocess.run(
        [NVCC, "-c", f"-arch={arch}", "-o", str(tmp_path / f"kernels_{arch}.o"), str(unit)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def _nvrtc():
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001 - not installed, or the NVRTC library does not load
        return None
    return nvrtc


def _nvrtc_compile(source: str, arch: str) -> tuple[bool, str]:
    nvrtc = _nvrtc()
    error, program = nvrtc.nvrtcCreateProgram(source.encode(), b"thunder.cu", 0, [], [])
    assert error == nvrtc.nvrtcResult.NVRTC_SUCCESS, error
    options = [f"--gpu-architecture={arch}".encode()]
    (error,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    # NVRTC writes the log into this buffer. ``b" " * 1`` is CPython's shared one-byte object:
    # writing into it (an empty log has size 1) would turn every b" " of the process into b"\x00"
    # (torch.load then read the pickled int 32 as 0). A fresh buffer of at least two bytes is ours.
    log = b" " * max(size, 2)
    nvrtc.nvrtcGetProgramLog(program, log)
    nvrtc.nvrtcDestroyProgram(program)
    return error == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")


@pytest.mark.skipif(
    _nvrtc() is None, reason="NVRTC is not installed (pip install cuda-bindings nvidia-cuda-nvrtc)"
)
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_nvrtc_compiles_the_kernels_without_any_header(sources, arch):
    """NVRTC is the compiler CuPy uses, and it includes no header: a math macro (INFINITY) or a
    CUDART_* constant that nvcc accepts fails here, as it would on the GPU."""
    from thunder_executor_cupy.codegen import SOFTMAX_SOURCE

    ok, log = _nvrtc_compile(SOFTMAX_SOURCE, arch)
    assert ok, log
    plain = [s for s in sources if "__half" not in s]  # half kernels need CuPy's own fp16 header
    ok, log = _nvrtc_compile(translation_unit(plain).removeprefix(PRELUDE), arch)
    assert ok, log
    refused, log = _nvrtc_compile('extern "C" __global__ void k(float* x) { x[0] = INFINITY; }', arch)
    assert not refused and "INFINITY" in log  # the check can fail
