"""While a candidate is being timed, nothing else of ours runs on its GPU: the caller verifies
the outputs produced inside the timing loop only after the child has finished timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.harness import evaluate

SEED = (Path(__file__).resolve().parents[2] / "kernels" / "seeds" / "softmax.py").read_text()


@pytest.mark.gpu
def test_timed_outputs_are_verified_after_the_exclusive_timing_phase() -> None:
    report = evaluate("softmax", SEED, device="cuda", tier="smoke")

    assert report["verdict"] == "accepted", report["reasons"]
    tl = report["timeline"]
    assert tl["benchmarking"] <= tl["gpu_done"] <= tl["timed_verified"], tl
    for shape in report["shapes"]:
        assert shape["errors"]["timed0"]["passed"], shape["label"]
    assert report["checks"]["timed_outputs"]["passed"] is True
