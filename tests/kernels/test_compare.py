"""compare(): a candidate output against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from kernels import problems
from kernels.harness.compare import compare

# The tolerance the interpreter runs softmax under: the tightest one in use.
TOL = problems.load("softmax").tolerance(torch.float32)


def _ref(m: int = 37, n: int = 1000, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=gen, dtype=torch.float64)


def test_an_exact_match_passes() -> None:
    ref = _ref()

    res = compare(ref.clone(), ref, TOL)

    assert res["passed"] is True
    assert res["mismatched"] == 0
    assert res["max_abs_err"] == 0.0
    assert res["rel_l2_err"] == 0.0
    assert "reason" not in res


def test_a_float32_rounding_of_the_reference_passes() -> None:
    ref = _ref()

    assert compare(ref.float(), ref, TOL)["passed"] is True


@pytest.mark.parametrize("fill", [float("nan"), 0.0], ids=["poisoned", "zeroed"])
def test_a_single_skipped_row_fails_on_every_element_of_that_row(fill: float) -> None:
    # Shifted away from zero so that a zeroed element is off by more than the tolerance.
    ref = _ref().abs() + 0.5
    out = ref.clone().float()
    out[5] = fill

    res = compare(out, ref, TOL)

    assert res["passed"] is False
    assert res["mismatched"] == ref.shape[1]
    assert res["bad_rows"] == 1
    assert res["first_bad_index"] == [5, 0]
    assert f"{ref.shape[1]} of {ref.numel()} elements outside tolerance" in res["reason"]


def test_nan_where_the_reference_is_finite_fails() -> None:
    ref = _ref()
    out = ref.clone()
    out[3, 7] = float("nan")

    res = compare(out, ref, TOL)

    assert res["passed"] is False
    assert res["mismatched"] == 1
    assert res["nonfinite_mismatched"] == 1
    assert "NaN/Inf" in res["reason"]


def test_a_finite_value_where_the_reference_is_inf_fails() -> None:
    ref = _ref()
    ref[0, 0] = math.inf
    out = ref.clone()
    out[0, 0] = 3.0e38

    res = compare(out, ref, TOL)

    assert res["passed"] is False
    assert res["nonfinite_mismatched"] == 1


def test_nan_and_inf_in_the_same_places_as_the_reference_pass() -> None:
    ref = _ref()
    ref[0, 0], ref[1, 1], ref[2, 2] = math.nan, math.inf, -math.inf
    out = ref.clone().float()

    res = compare(out, ref, TOL)

    assert res["passed"] is True, res.get("reason")
    assert res["nonfinite_mismatched"] == 0
    assert math.isfinite(res["ref_rms"]) and math.isfinite(res["rel_l2_err"])


def test_an_inf_of_the_wrong_sign_fails() -> None:
    ref = _ref()
    ref[1, 1] = math.inf
    out = ref.clone()
    out[1, 1] = -math.inf

    res = compare(out, ref, TOL)

    assert res["passed"] is False
    assert res["nonfinite_mismatched"] == 1


def test_a_systematic_error_within_the_elementwise_bound_fails_on_l2() -> None:
    ref = _ref(64, 4096)
    rms = float(ref.square().mean().sqrt())
    # Every element off by 90% of its own elementwise bound, all in the same direction.
    bound = TOL["atol"] * rms + TOL["rtol"] * ref.abs()
    out = ref + ref.sign() * 0.9 * bound

    res = compare(out, ref, TOL)

    assert res["mismatched"] == 0
    assert res["rel_l2_err"] > TOL["l2"]
    assert res["passed"] is False
    assert f"limit {TOL['l2']:g}" in res["reason"]


def test_a_random_error_within_both_bounds_passes() -> None:
    ref = _ref(64, 4096)
    gen = torch.Generator().manual_seed(1)
    noise = (torch.rand(ref.shape, generator=gen, dtype=torch.float64) - 0.5) * 2
    out = ref * (1 + 0.5 * TOL["rtol"] * noise)

    res = compare(out, ref, TOL)

    assert res["passed"] is True, res.get("reason")


@pytest.mark.parametrize("shape", [(37, 999), (999, 37), (37 * 1000,), (1, 37, 1000)])
def test_a_shape_mismatch_fails(shape: tuple[int, ...]) -> None:
    ref = _ref()
    out = torch.zeros(shape, dtype=torch.float32)

    res = compare(out, ref, TOL)

    assert res["passed"] is False
    assert "shape" in res["reason"] and str(list(shape)) in res["reason"]
