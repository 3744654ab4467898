"""Re-validation before release (kernels.revalidate, kernels.harness.e2e)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels import problems
from kernels.harness import e2e
from kernels.revalidate import revalidate, sweep

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HONEST = (FIXTURES / "honest" / "softmax_tuned.py").read_text()
WRONG_OUTSIDE_SMOKE = (FIXTURES / "revalidation" / "wrong_outside_smoke.py").read_text()
GRAPH_BREAKING = (FIXTURES / "exploits" / "graph_breaking.py").read_text()


def test_the_interpreter_sweep_adds_full_sweep_shapes_beyond_the_smoke_sweep():
    softmax = problems.load("softmax")
    shapes = sweep(softmax, "interpret", None)
    smoke = softmax.shapes("smoke")
    assert shapes[: len(smoke)] == smoke
    extra = [s for s in shapes if s not in smoke]
    assert extra and all(s in softmax.shapes("full") for s in extra)


def test_the_sweep_keeps_only_shapes_in_the_approved_range():
    softmax = problems.load("softmax")
    shapes = sweep(softmax, "cuda", {"M": [1, 4096], "N": [1, 4096]})
    assert shapes and all(s["M"] <= 4096 and s["N"] <= 4096 for s in shapes)
    assert {"M": 65536, "N": 4096} not in shapes


def test_a_range_holding_no_sweep_shape_is_refused():
    report = revalidate("softmax", HONEST, device="interpret", shape_range={"N": [3, 4]})
    assert report["verdict"] == "rejected"
    assert report["revalidation"]["passed"] is False
    assert "no shape" in report["revalidation"]["reasons"][0]


def test_an_honest_kernel_passes_on_the_interpreter_with_the_block_check():
    report = revalidate("softmax", HONEST, device="interpret")
    assert report["revalidation"]["passed"] is True, report["reasons"]
    assert report["checks"]["end_to_end"]["passed"] is True
    assert report["checks"]["cuda_graph"]["passed"] is None  # needs CUDA
    assert "M=1,N=4096" in report["revalidation"]["shapes"]


def test_a_kernel_wrong_on_a_shape_outside_the_smoke_sweep_is_rejected():
    # The ordinary trial evaluation (smoke sweep) accepts it ...
    from kernels.harness import evaluate

    assert evaluate("softmax", WRONG_OUTSIDE_SMOKE, device="interpret")["verdict"] == "accepted"
    # ... re-validation does not.
    report = revalidate("softmax", WRONG_OUTSIDE_SMOKE, device="interpret")
    assert report["revalidation"]["passed"] is False
    assert report["failure"] == "incorrect"
    assert any("N=4096" in r for r in report["revalidation"]["reasons"])


@pytest.mark.parametrize("problem", problems.BUILTIN)
def test_the_block_with_the_reference_in_the_slot_matches_itself(problem):
    kernel = problems.load(problem).module.reference
    result = e2e.run(problem, kernel, device="cpu", dtype=torch.float32, seed=3)
    assert result["passed"] is True, result
    assert result["rel_l2_err"] <= 1e-6


@pytest.mark.parametrize("problem", ["softmax", "rmsnorm", "matmul", "attention"])
def test_the_block_catches_a_kernel_that_is_slightly_wrong(problem):
    ref = problems.load(problem).module.reference

    def wrong(*args):
        return ref(*args) * 1.01

    result = e2e.run(problem, wrong, device="cpu", dtype=torch.float32, seed=3)
    assert result["passed"] is False
    assert result["failure"] == "incorrect"


# -- on the GPU (the lead runs these on the H200) ---------------------------------------------


@pytest.mark.gpu
def test_gpu_revalidation_passes_an_honest_kernel_with_graph_and_block_checks():
    report = revalidate("softmax", HONEST, device="cuda", shape_range={"M": [1, 4096]})
    assert report["revalidation"]["passed"] is True, report["revalidation"]["reasons"]
    assert report["checks"]["cuda_graph"]["passed"] is True
    assert report["checks"]["end_to_end"]["passed"] is True
    assert report["end_to_end"]["candidate_ms"] > 0


@pytest.mark.gpu
def test_gpu_revalidation_rejects_a_kernel_that_breaks_cuda_graph_capture():
    report = revalidate("softmax", GRAPH_BREAKING, device="cuda", shape_range={"M": [1, 4096]})
    assert report["revalidation"]["passed"] is False
    assert any("graph" in r.lower() for r in report["revalidation"]["reasons"])


@pytest.mark.gpu
def test_gpu_block_check_rejects_a_kernel_that_syncs_inside_the_graph():
    ref = problems.load("softmax").module.reference

    def syncing(x):
        torch.cuda.synchronize()  # legal alone, illegal inside a captured graph
        return ref(x)

    result = e2e.run("softmax", syncing, device="cuda", dtype=torch.bfloat16, seed=1)
    assert result["passed"] is False
    assert "captured" in result["detail"]


@pytest.mark.gpu
def test_gpu_block_check_rejects_a_kernel_that_slows_the_block():
    ref = problems.load("rmsnorm").module.reference
    ballast = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def slow(x, w):
        ballast.zero_()  # 256 MiB of writes per call: the block gets slower
        return ref(x, w)

    result = e2e.run("rmsnorm", slow, device="cuda", dtype=torch.bfloat16, seed=1)
    assert result["passed"] is False
    assert "slows the block" in result["detail"]
