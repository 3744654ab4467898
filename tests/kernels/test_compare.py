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


def test_an_rms_floor_bounds_a_tiny_output_by_the_problems_magnitude_not_its_own() -> None:
    # One GELU deep in its tail: PyTorch's own float32 value is all error against float64
    # (z = -5.2), yet 6e-8 off in absolute terms, far inside what any element of a large output
    # of this problem may be off (atol times an RMS of about 0.74).
    tol = problems.load("matmul_bias_gelu").tolerance(torch.float32)
    z = torch.tensor([[-5.2]])
    ref = torch.nn.functional.gelu(z.double(), approximate="tanh")
    eager = torch.nn.functional.gelu(z, approximate="tanh")
    unfloored = {k: v for k, v in tol.items() if k != "rms_floor"}

    assert compare(eager, ref, unfloored)["passed"] is False  # relative to its own tiny value
    res = compare(eager, ref, tol)
    assert res["passed"] is True, res
    assert res["tolerance"]["rms_floor"] == 0.5
    # Where the float64 value is exactly 0 (z = -8), the bound is the floor's, not zero.
    zero = torch.zeros(1, 1, dtype=torch.float64)
    assert compare(torch.tensor([[1e-7]]), zero, tol)["passed"] is True
    assert compare(torch.tensor([[1e-7]]), zero, unfloored)["passed"] is False


def test_an_rms_floor_still_fails_an_error_beyond_it() -> None:
    tol = {"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5, "rms_floor": 0.5}
    ref = torch.full((1, 1), -5.7e-8, dtype=torch.float64)

    res = compare(torch.tensor([[1e-5]]), ref, tol)  # 2e-5 of the floor: twice the bound

    assert res["passed"] is False
    assert "1 of 1 elements outside tolerance" in res["reason"]
    # And it changes nothing where the output's own RMS is above it.
    big = _ref()
    off = big + 2e-5 * big.square().mean().sqrt()
    assert compare(off, big, tol)["passed"] is compare(off, big, {**tol, "rms_floor": 0})["passed"]
    assert compare(off, big, tol)["passed"] is False


def test_the_l2_bound_uses_the_floor_too() -> None:
    tol = {"atol": 1.0, "rtol": 1.0, "l2": 1e-5, "rms_floor": 0.5}  # only the L2 bound binds
    ref = torch.full((4, 1), 1e-9, dtype=torch.float64)

    assert compare(ref + 4e-6, ref, tol)["passed"] is True  # 4e-6 / (0.5 * 2) = 4e-6
    assert compare(ref + 2e-5, ref, tol)["passed"] is False  # 2e-5 / 1 = 2e-5
