"""benchmarks/child_boot.py: what one sandboxed child's start costs, run as a user runs it, on
the CPU (the GPU host adds the CUDA steps)."""

from __future__ import annotations

import json

from tests.benchmarks import run_script


def test_one_start_is_measured_step_by_step(tmp_path):
    out = tmp_path / "boot.json"
    p = run_script(
        "child_boot.py", "--device", "interpret", "--children", "1", "--repeats", "1",
        "--json", str(out),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["compiled_first"] == {}  # this environment's packages came with their bytecode
    assert d["children"]["n"] == 1 and len(d["children"]["wall_s"]) == 1
    # The caller's reading of a real child: torch alone costs CPU seconds, and the child never
    # reports its own.
    assert d["children"]["median_cpu_s"] > 0.2
    steps = d["steps"]
    assert list(steps) == ["interpreter", "torch", "torch._dynamo", "triton", "harness"]
    assert steps["torch"]["cpu_s"] > 0 and steps["torch._dynamo"]["cpu_s"] > 0  # no CUDA here
    rows = d["bytecode"]
    assert rows["torch"]["modules"] > 100 and rows["sympy"]["modules"] > 50
    assert all(0 <= r["with_bytecode"] <= r["modules"] for r in rows.values())
    assert d["imports"] and d["imports"][0]["self_s"] >= d["imports"][-1]["self_s"]
    assert "torch" in {r["package"] for r in d["imports"]}


def test_a_count_below_one_is_refused():
    p = run_script("child_boot.py", "--device", "interpret", "--children", "0")
    assert p.returncode == 2
    assert "--children and --repeats must be at least 1" in p.stderr
