"""The conformance kit: PyTorch's OpInfo checks run against one named executor.

In an executor package's tests::

    from thunder_core.testing.conformance import conformance_tests

    test_forward, test_gradients = conformance_tests("numba")

Each becomes one pytest test per OpInfo whose samples the executor claims at least one
operation of: the output (and the input gradients) through ``jit(executors=[name])`` must
match eager PyTorch. OpInfos the executor claims nothing of are skipped with that reason,
so a run says exactly what the executor covers.
"""

from __future__ import annotations

import os

import pytest
import torch

import thunder_core
from thunder_core.testing.known_failures import KNOWN_FORWARD_FAILURES, KNOWN_GRADIENT_FAILURES
from thunder_core.testing.opinfo import (
    assert_same,
    check_grads,
    draws_random_numbers,
    grad_cases,
    input_grads,
    is_deterministic,
    op_db,
    opinfo_id,
    run_case,
    sample_cases,
)


def _claimed(jfn, executor: str) -> bool:
    return any(report.executor == executor for report in thunder_core.explain(jfn).operations)


#: OpInfos of the ops transformer models are made of: a quick selection for executors whose
#: every claimed region is an expensive compile (``conformance_tests(..., ops=TRANSFORMER_OPS)``).
TRANSFORMER_OPS = (
    "add", "sub", "mul", "div.no_rounding_mode", "neg", "exp", "log", "rsqrt", "sqrt", "tanh", "sigmoid",
    "pow", "where", "masked_fill", "clamp", "sum", "mean", "var", "amax", "softmax", "log_softmax",
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.relu", "nn.functional.layer_norm",
    "nn.functional.rms_norm", "nn.functional.cross_entropy", "cat", "stack", "split", "chunk", "narrow",
    "transpose", "permute", "reshape", "view", "unsqueeze", "squeeze", "flatten", "expand", "tril", "triu",
    "cumsum", "gather", "index_select", "repeat_interleave", "to", "float", "erf", "maximum", "minimum",
)  # fmt: skip


def _opinfos(ops=None):
    """All non-random OpInfos, or those named in ``ops``; ``THUNDER_CONFORMANCE=full`` forces all."""
    selected = [o for o in op_db() if not draws_random_numbers(o)]
    if ops is not None and os.environ.get("THUNDER_CONFORMANCE") != "full":
        wanted = set(ops)
        selected = [o for o in selected if opinfo_id(o) in wanted]
    return selected


def check_forward(
    opinfo, executor: str, dtype=torch.float32, options: dict | None = None, device: str = "cpu"
) -> bool:
    """True if ``executor`` claimed something; raises if a result differs from eager."""
    claimed = False
    options = {"executors": [executor], "options": options or {}}
    for case in sample_cases(opinfo, device=device, dtype=dtype):
        if not is_deterministic(case):
            continue
        try:
            actual, expected, jfn = run_case(case, options)
        except thunder_core.DataDependentError:
            return False
        if _claimed(jfn, executor):
            claimed = True
            assert_same(actual, expected)
    return claimed


def check_gradients(opinfo, executor: str, options: dict | None = None, device: str = "cpu") -> bool:
    if not opinfo.supports_autograd:
        return False
    claimed = False
    for case in grad_cases(opinfo, device=device):
        try:
            input_grads(case.fn, case.leaves)
        except Exception:  # noqa: BLE001 - eager cannot run this sample: nothing to compare with
            continue
        try:
            jfn = check_grads(case, {"executors": [executor], "options": options or {}})
        except thunder_core.DataDependentError:
            return False
        claimed |= _claimed(jfn, executor)
    return claimed


def _unavailable(executor: str, device: str) -> str | None:
    """Why these tests cannot run here: the executor's own probe reason, or a missing device."""
    from thunder_core.testing.plugins import plugin_info

    try:
        info = plugin_info(executor)
    except KeyError:
        info = None
    if info is not None and info.status != "available":
        return f"{executor} is {info.status}: {info.reason}"
    if device.startswith("cuda") and not torch.cuda.is_available():
        return "samples on CUDA need a CUDA device (torch.cuda.is_available() is False)"
    return None


def conformance_tests(executor: str, options: dict | None = None, ops=None, device: str = "cpu"):
    """Two pytest test functions (forward, gradients), parametrized over the OpInfo database.

    ``options`` are passed as ``jit(options=...)``, e.g. ``{"numba": {"min_region_size": 1}}``
    so that single operations are handed to a fusion executor too. ``ops`` limits the sweep
    to those OpInfo names (e.g. ``TRANSFORMER_OPS``) unless ``THUNDER_CONFORMANCE=full``.
    ``device`` is where the samples are built (``"cuda"`` for GPU executors); without that
    device every test skips with the reason. ``THUNDER_CONFORMANCE_DEVICE=cuda`` builds a
    CPU kit's samples on that device instead (an executor that also runs on the GPU, such as
    Inductor generating Triton kernels, is then checked there).
    """
    device = os.environ.get("THUNDER_CONFORMANCE_DEVICE") or device
    opinfos = _opinfos(ops)
    ids = [opinfo_id(o) for o in opinfos]
    missing = _unavailable(executor, device) if device != "cpu" else None

    @pytest.mark.parametrize("opinfo", opinfos, ids=ids)
    def test_forward(opinfo):
        known = KNOWN_FORWARD_FAILURES.get(opinfo_id(opinfo))
        if known:
            pytest.skip(f"fails in the core too: {known}")
        if missing:
            pytest.skip(missing)
        if not check_forward(opinfo, executor, options=options, device=device):
            pytest.skip(f"{executor} claims no operation of {opinfo_id(opinfo)}")

    @pytest.mark.parametrize("opinfo", opinfos, ids=ids)
    def test_gradients(opinfo):
        known = KNOWN_FORWARD_FAILURES.get(opinfo_id(opinfo)) or KNOWN_GRADIENT_FAILURES.get(
            opinfo_id(opinfo)
        )
        if known:
            pytest.skip(f"fails in the core too: {known}")
        if missing:
            pytest.skip(missing)
        if not check_gradients(opinfo, executor, options, device=device):
            pytest.skip(f"{executor} claims no operation of {opinfo_id(opinfo)}'s training trace")

    return test_forward, test_gradients
