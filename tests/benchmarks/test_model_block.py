"""benchmarks/model_block.py in its CPU smoke mode: the model block through the library, with
real Triton releases in the interpreter, against eager and torch.compile (outputs only)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.benchmarks import ROOT, run_script

HONEST = ROOT / "tests" / "fixtures" / "honest"
pytestmark = pytest.mark.slow


def library(root: Path, rmsnorm_source: str) -> Path:
    """A library directory with an rmsnorm release for every smoke shape and a swiglu release
    for up to 8 rows (decode's 2 rows, not prefill's 14)."""
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "r1.py").write_text(rmsnorm_source)
    (root / "kernels" / "r2.py").write_text((HONEST / "swiglu_tuned.py").read_text())
    rows = {"M": [0, 0], "N": [0, 1]}
    manifest = {
        "format": 1,
        "problems": {"rmsnorm": {"dims": rows, "ranks": [2, 1]}},  # swiglu: from the registry
        "releases": [
            {
                "id": 1,
                "problem": "rmsnorm",
                "kind": "interpret",
                "dtype": "float32",
                "shape_range": {"M": [1, 64], "N": [1, 4096]},
                "file": "kernels/r1.py",
            },
            {
                "id": 2,
                "problem": "swiglu",
                "kind": "interpret",
                "dtype": "float32",
                "shape_range": {"M": [1, 8], "N": [1, 4096]},
                "file": "kernels/r2.py",
            },
        ],
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def bench(*args: str) -> subprocess.CompletedProcess:
    return run_script("model_block.py", "--smoke", *args, timeout=900)


def test_the_smoke_run_reports_which_ops_ran_a_release_and_which_fell_back(tmp_path):
    lib = library(tmp_path / "lib", (HONEST / "rmsnorm_tuned.py").read_text())
    out = bench("--library", str(lib), "--json", str(tmp_path / "out.json"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["mode"] == "smoke" and report["dtype"] == "float32"
    assert report["library"]["releases"] == {"rmsnorm": 1, "swiglu": 1}
    runs = {r["phase"]: r for r in report["runs"]}
    assert set(runs) == {"prefill", "decode"}
    for run in runs.values():
        assert run["ok"], run["checks"]
        # each against the eager block; compiling the released block traces the references
        assert set(run["checks"]) == {"released", "compiled", "released_compiled"}
        assert "released_ms" not in run and "eager_ms" not in run  # no timing on the CPU
        assert all("timing" not in op for op in run["ops"])

    def ran(phase: str, op: str) -> set[str]:
        return {o["ran"] for o in runs[phase]["ops"] if o["op"] == op}

    assert ran("prefill", "rmsnorm") == ran("decode", "rmsnorm") == {"release #1"}
    assert ran("decode", "swiglu") == {"release #2"}
    assert ran("prefill", "swiglu") == {"reference"}
    (swiglu,) = [o for o in runs["prefill"]["ops"] if o["op"] == "swiglu"]
    assert swiglu["why"] == "M=14,N=96 outside every released range (M=1..8,N=1..4096)"
    assert ran("prefill", "matmul") == {"reference"}
    assert {o["why"] for o in runs["prefill"]["ops"] if o["op"] == "matmul"} == {
        "no release of matmul"
    }
    assert ran("decode", "decode_attention") == {"torch"}
    assert ran("prefill", "attention") == {"reference"}
    assert runs["prefill"]["released_ops"] == 1 and runs["decode"]["released_ops"] == 2
    assert "smoke run on the CPU: outputs checked, nothing timed" in out.stdout


def test_a_release_that_changes_the_blocks_output_fails_the_run(tmp_path):
    wrong = "def kernel(x, weight):\n    return x.clone()\n"  # not normalised at all
    lib = library(tmp_path / "lib", wrong)
    out = bench("--library", str(lib), "--phases", "prefill", "--no-compile")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "released: rel. L2" in out.stdout
