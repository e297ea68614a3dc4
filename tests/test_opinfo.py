"""PyTorch's OpInfo database through thunder_core, float32 on CPU, against eager."""

from __future__ import annotations

import pytest
import torch
from opinfo_known_failures import KNOWN_FORWARD_FAILURES
from opinfo_support import (
    assert_same,
    draws_random_numbers,
    is_deterministic,
    op_db,
    opaque_ops,
    opinfo_id,
    run_case,
    run_decomposed,
    sample_cases,
)

REQUIRED_PASS_RATE = 0.95


def _sweep():
    results = {"passed": [], "failed": {}, "skipped_random": [], "opaque": [], "decomposition_failed": {}}
    for opinfo in op_db():
        name = opinfo_id(opinfo)
        try:
            cases = sample_cases(opinfo)
        except Exception:
            continue
        if not cases:
            continue
        if draws_random_numbers(opinfo) or not all(is_deterministic(c) for c in cases):
            results["skipped_random"].append(name)
            continue
        try:
            used_opaque = False
            for case in cases:
                actual, expected, trace = run_case(case)
                assert_same(actual, expected)
                used_opaque |= bool(opaque_ops(trace))
                assert_same(run_decomposed(trace, case), expected)
        except Exception as error:  # noqa: BLE001 - every failure is reported by name below
            results["failed"][name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
            continue
        results["passed"].append(name)
        if used_opaque:
            results["opaque"].append(name)
    return results


@pytest.fixture(scope="module")
def sweep():
    return _sweep()


@pytest.mark.slow
def test_opinfo_pass_rate(sweep):
    passed, failed = len(sweep["passed"]), len(sweep["failed"])
    rate = passed / (passed + failed)
    print(
        f"\nOpInfo forward (float32, CPU): {passed}/{passed + failed} deterministic OpInfos match eager "
        f"({rate:.1%}); {len(sweep['opaque'])} of them ran at least one op as an opaque torch call; "
        f"{len(sweep['skipped_random'])} random OpInfos not compared."
    )
    assert rate >= REQUIRED_PASS_RATE


@pytest.mark.slow
def test_failures_are_exactly_the_known_ones(sweep):
    unexpected = {k: v for k, v in sweep["failed"].items() if k not in KNOWN_FORWARD_FAILURES}
    fixed = sorted(k for k in KNOWN_FORWARD_FAILURES if k in sweep["passed"])
    assert not unexpected, f"new OpInfo failures: {unexpected}"
    assert not fixed, f"these now pass, remove them from tests/opinfo_known_failures.py: {fixed}"


@pytest.mark.slow
def test_known_data_dependent_failures_raise_a_clear_error():
    from thunder_core import DataDependentError

    db = {opinfo_id(o): o for o in op_db()}
    case = sample_cases(db["nonzero"])[0]
    with pytest.raises(DataDependentError, match="torch.where"):
        run_case(case)
    assert torch.is_tensor(case.leaves[0])
