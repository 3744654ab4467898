"""benchmarks/oracle_cost.py: the eager against the compiled oracle per shape, on a GPU only."""

from __future__ import annotations

import json

import pytest
import torch

from tests.benchmarks import ROOT, run_script


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without a GPU")
def test_without_a_gpu_it_says_so() -> None:
    res = run_script("oracle_cost.py", "--problem", "softmax")

    assert res.returncode == 2
    assert "needs a CUDA GPU" in res.stderr


def test_the_recorded_run_has_every_shape_and_the_oracles_agree() -> None:
    rows = json.loads((ROOT / "docs/benchmarks/search/oracle-2026-12-06-h100.json").read_text())

    assert len(rows) == 11
    assert all(r["max_rel"] < 1e-12 for r in rows)
    assert sum(r["compiled_ms"] for r in rows) < sum(r["eager_ms"] for r in rows)
