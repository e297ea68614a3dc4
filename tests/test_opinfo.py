"""PyTorch's OpInfo database through thunder_core, float32 on CPU, against eager."""

from __future__ import annotations

import pytest
import torch

import thunder_core
from thunder_core.testing.known_failures import KNOWN_FORWARD_FAILURES, KNOWN_GRADIENT_FAILURES
from thunder_core.testing.opinfo import (
    assert_same,
    check_grads,
    draws_random_numbers,
    grad_cases,
    is_deterministic,
    op_db,
    opaque_ops,
    opinfo_id,
    run_case,
    run_decomposed,
    sample_cases,
)

REQUIRED_PASS_RATE = 0.95
REQUIRED_SYMBOL_ONLY_RATE = 0.50  # matched with every op captured as a thunder_core symbol
REQUIRED_GRADIENT_PASS_RATE = 0.90


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
                actual, expected, jfn = run_case(case)
                trace = thunder_core.last_traces(jfn)[0]
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


def forward_counts(sweep) -> dict[str, int]:
    """The three honest counts: matched with symbols only, matched with opaque calls, failed."""
    opaque = len(sweep["opaque"])
    return {
        "symbols only": len(sweep["passed"]) - opaque,
        "with opaque calls": opaque,
        "failed": len(sweep["failed"]),
    }


@pytest.mark.slow
def test_opinfo_pass_rate(sweep):
    counts = forward_counts(sweep)
    total = sum(counts.values())
    passed = counts["symbols only"] + counts["with opaque calls"]
    print(
        f"\nOpInfo forward (float32, CPU), {total} deterministic OpInfos: "
        f"{counts['symbols only']} match eager with every op captured as a thunder_core symbol "
        f"({counts['symbols only'] / total:.1%}); {counts['with opaque calls']} match with at least one opaque "
        f"torch call (eager against eager for that op); {counts['failed']} fail. "
        f"{len(sweep['skipped_random'])} random OpInfos not compared."
    )
    assert passed / total >= REQUIRED_PASS_RATE
    assert counts["symbols only"] / total >= REQUIRED_SYMBOL_ONLY_RATE


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


def _gradient_sweep(forward_passed):
    from thunder_core.autodiff.fallback import AUTOGRAD_FALLBACK

    results = {"passed": [], "failed": {}, "fallback": []}
    for opinfo in op_db():
        name = opinfo_id(opinfo)
        if name not in forward_passed or not opinfo.supports_autograd:
            continue
        try:
            cases = grad_cases(opinfo)
        except Exception:
            continue
        try:
            used_fallback = False
            for case in cases:
                jfn = check_grads(case)
                traces = thunder_core.last_traces(jfn)
                used_fallback |= any(
                    b.symbol.has_tag(AUTOGRAD_FALLBACK) for t in traces for b in t.bound_symbols
                )
        except Exception as error:  # noqa: BLE001 - every failure is reported by name below
            results["failed"][name] = (
                f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
            )
            continue
        results["passed"].append(name)
        if used_fallback:
            results["fallback"].append(name)
    return results


@pytest.fixture(scope="module")
def gradient_sweep(sweep):
    return _gradient_sweep(set(sweep["passed"]))


@pytest.mark.slow
def test_opinfo_gradients(gradient_sweep):
    passed, failed = len(gradient_sweep["passed"]), len(gradient_sweep["failed"])
    rate = passed / (passed + failed)
    fallback = len(gradient_sweep["fallback"])
    print(
        f"\nOpInfo gradients (float32, CPU): {passed}/{passed + failed} OpInfos that support autograd and pass "
        f"forward give eager's input gradients ({rate:.1%}): {passed - fallback} with thunder_core's own VJP "
        f"rules only, {fallback} with the PyTorch-autograd fallback for at least one op; {failed} fail."
    )
    assert rate >= REQUIRED_GRADIENT_PASS_RATE
    unexpected = {k: v for k, v in gradient_sweep["failed"].items() if k not in KNOWN_GRADIENT_FAILURES}
    fixed = sorted(k for k in KNOWN_GRADIENT_FAILURES if k in gradient_sweep["passed"])
    assert not unexpected, f"new gradient failures: {unexpected}"
    assert not fixed, f"these now pass, remove them from KNOWN_GRADIENT_FAILURES: {fixed}"
