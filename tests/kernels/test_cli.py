"""`python -m kernels`, run as a user runs it: a subprocess, exit codes, stdout/stderr, JSON."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "kernels" / "seeds" / "softmax.py"
EXPLOITS = ROOT / "tests" / "fixtures" / "exploits"
# A problem whose float64 reference runs the caller out of memory every time.
OOM_PROBLEMS = ROOT / "tests" / "fixtures" / "problems"

# docs/problems.md: the built-in problems and their kernel signatures.
BUILTINS = {
    "softmax": "kernel(x)",
    "rmsnorm": "kernel(x, weight)",
    "layernorm": "kernel(x, weight, bias)",
    "swiglu": "kernel(a, b)",
    "rope": "kernel(x, cos, sin)",
    "matmul": "kernel(a, b)",
    "matmul_bias_gelu": "kernel(a, b, bias)",
    "attention": "kernel(q, k, v)",
}
REPORT_KEYS = {"verdict", "failure", "reasons", "device", "checks", "shapes", "summary"}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernels", *map(str, args)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def evaluate_cli(
    problem: str, candidate: Path, out: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return cli(
        *("evaluate", "--problem", problem, "--candidate", str(candidate)),
        *("--device", "interpret", "--json", str(out), "--quiet"),
        env=env,
    )


def test_problems_lists_every_builtin_with_its_signature() -> None:
    res = cli("problems")

    assert res.returncode == 0, res.stderr
    heads = [line.split() for line in res.stdout.splitlines() if line and not line[0].isspace()]
    listed = {h[0]: " ".join(h[1:]).split(" dtypes:")[0] for h in heads}
    for name, signature in BUILTINS.items():
        assert listed.get(name) == signature, (name, listed.get(name))
    assert "smoke (" in res.stdout and "full  (" in res.stdout


def test_evaluate_accepts_the_seed_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"

    res = evaluate_cli("softmax", SEED, out)

    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert set(report) >= REPORT_KEYS
    assert report["verdict"] == "accepted"
    assert report["failure"] is None
    assert report["device"]["kind"] == "interpret"
    assert len(report["shapes"]) == report["summary"]["shapes"] > 0
    assert "verdict: accepted" in res.stdout
    # The source it judged travels with it, so another host can import it and check it.
    assert report["source"] == SEED.read_text()
    assert report["source_sha256"] == hashlib.sha256(SEED.read_bytes()).hexdigest()


def test_evaluate_exits_1_on_an_exploit(tmp_path: Path) -> None:
    out = tmp_path / "report.json"

    res = evaluate_cli("softmax", EXPLOITS / "library_fallback.py", out)

    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert report["verdict"] == "rejected"
    assert report["failure"] == "prohibited"
    assert "verdict: rejected (prohibited)" in res.stdout


def test_evaluate_exits_3_with_no_report_when_the_harness_cannot_check(tmp_path: Path) -> None:
    # A user's problem whose float64 reference runs the caller out of memory every time (in
    # the caller's process only: the candidate's runs `reference`). Past the retries, that is
    # the harness's fault: no report, so no verdict the candidate could be blamed for.
    out = tmp_path / "report.json"

    res = cli(
        *("evaluate", "--problem", "softmax_oom", "--problems-dir", OOM_PROBLEMS),
        *("--candidate", SEED, "--device", "interpret", "--json", out, "--quiet"),
    )

    assert res.returncode == 3, res.stdout + res.stderr
    assert "this process ran out of memory" in res.stderr
    assert "the candidate was not judged" in res.stderr
    assert not out.exists()


def test_a_report_judged_on_a_later_attempt_says_so() -> None:
    from kernels.cli import print_report

    rep = {
        "problem": "softmax",
        "tier": "smoke",
        "dtype": "float32",
        "device": {"kind": "interpret", "name": "Triton CPU interpreter"},
        "shapes": [],
        "checks": {},
        "summary": {
            "geomean_speedup_eager": None,
            "geomean_speedup_compiled": None,
            "min_speedup_eager": None,
            "seconds": 1.0,
        },
        "verdict": "accepted",
        "failure": None,
        "reasons": [],
    }
    out = io.StringIO()
    print_report(rep, out)
    assert "attempt" not in out.getvalue()

    rep["harness_faults"] = ["M=1: its reference: this process ran out of memory"]
    out = io.StringIO()
    print_report(rep, out)
    assert "judged on attempt 2; the harness failed before:" in out.getvalue()
    assert "  - M=1: its reference: this process ran out of memory" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--problem", "no_such_problem", "--candidate", SEED, "--device", "interpret"],
            "unknown problem 'no_such_problem'",
        ),
        (
            ["--problem", "softmax", "--candidate", "/nonexistent/k.py", "--device", "interpret"],
            "does not exist",
        ),
        (["--problem", "softmax", "--candidate", SEED, "--device", "tpu"], "--device"),
        (
            ["--problem", "softmax", "--candidate", SEED, "--device", "interpret", "--shapes", "x"],
            "--shapes",
        ),
        (["--candidate", SEED, "--device", "interpret"], "--problem"),
    ],
    ids=["unknown_problem", "missing_file", "bad_device", "bad_shapes", "no_problem"],
)
def test_evaluate_exits_2_on_a_usage_error(args: list, message: str) -> None:
    res = cli("evaluate", *args)

    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert "verdict" not in res.stdout


def test_tune_checks_configs_on_the_interpreter_without_ranking_them(tmp_path: Path) -> None:
    out = tmp_path / "tune.json"

    res = cli(
        "tune", "--problem", "softmax", "--device", "interpret", "--trials", "3", "--json", out
    )

    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(out.read_text())
    assert len(result["trials"]) == 3
    assert [t["status"] for t in result["trials"]][0] == "kept"
    assert {t["status"] for t in result["trials"]} <= {"kept", "reverted", "failed"}
    assert all(t["geomean_ms"] is None for t in result["trials"])
    assert result["ranked"] is False
    assert result["failures"] == 0
    assert result["best_report"]["verdict"] == "accepted"
    assert "ranked: False" in res.stdout


def test_tune_exits_2_without_knobs(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text(SEED.read_text().replace("# tune:", "# was:"))

    res = cli("tune", "--problem", "softmax", "--candidate", plain, "--device", "interpret")

    assert res.returncode == 2
    assert "no '# tune:' knobs" in res.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trials", "0"], "--trials must be at least 1"),
        (["--trials", "-3"], "--trials must be at least 1"),
        (["--minutes", "0"], "--minutes must be above 0"),
        (["--minutes", "-1.5"], "--minutes must be above 0"),
        (["--ahead", "-1"], "--ahead must be from 0 to 254 (--jobs + --ahead)"),
        (["--jobs", "200", "--ahead", "57"], "--ahead must be from 0 to 56 (--jobs + --ahead)"),
        # The default --ahead (a third of --jobs) never exceeds the cap: the next check speaks.
        (["--jobs", "250", "--minutes", "0"], "--minutes must be above 0"),
        (["--linger", "-5"], "--linger is a number of seconds above 0, or 0 to turn it off"),
        (["--linger", "nan"], "--linger is a number of seconds above 0, or 0 to turn it off"),
        (["--linger", "inf"], "--linger is a number of seconds above 0, or 0 to turn it off"),
        (["--stagger", "-1"], "--stagger is a number of seconds above 0, or 0 to turn it off"),
        (["--stagger", "nan"], "--stagger is a number of seconds above 0, or 0 to turn it off"),
    ],
    ids=[
        "zero_trials",
        "negative_trials",
        "zero_minutes",
        "negative_minutes",
        "negative_ahead",
        "too_many_in_flight",
        "default_ahead_within_the_cap",
        "negative_linger",
        "nan_linger",
        "infinite_linger",
        "negative_stagger",
        "nan_stagger",
    ],
)
def test_tune_exits_2_on_a_budget_that_allows_nothing(args: list, message: str) -> None:
    res = cli("tune", "--problem", "softmax", "--device", "interpret", *args)

    assert res.returncode == 2, res.stdout + res.stderr
    assert f"error: {message}" in res.stderr
    assert "Traceback" not in res.stderr and "trial" not in res.stdout


def test_tune_with_more_trials_than_the_space_says_so_and_tries_it_all(tmp_path: Path) -> None:
    small = tmp_path / "two.py"  # 2 x 1 configurations
    small.write_text(
        SEED.read_text()
        .replace("# tune: 256, 512, 1024, 2048, 4096, 8192", "# tune: 1024, 2048")
        .replace("# tune: 1, 2, 4, 8, 16", "# tune: 4")
    )
    out = tmp_path / "tune.json"

    res = cli(
        *("tune", "--problem", "softmax", "--candidate", small, "--device", "interpret"),
        *("--trials", "5", "--json", out),
    )

    assert res.returncode == 0, res.stdout + res.stderr
    assert "--trials 5 is more than the 2 configurations" in res.stderr
    assert "the whole space (2 configs) is tried" in res.stderr
    assert len(json.loads(out.read_text())["trials"]) == 2


def test_ceilings_on_the_interpreter_exits_2_with_a_message() -> None:
    res = cli("ceilings", "--device", "interpret")

    assert res.returncode == 2
    assert "CUDA" in res.stderr
    assert "Traceback" not in res.stderr


# ---- extra problem directories ----------------------------------------------------------

ROWSCALE = '''\
"""Scale by two: y = 2 * x, output dtype = x.dtype."""

from __future__ import annotations

import torch

SIGNATURE = "kernel(x)"
DESCRIPTION = "x [M, N]; y = 2 * x."
DIMS = {"M": (0, 0), "N": (0, 1)}
RANKS = (2,)
SHAPES_FULL = [{"M": 4096, "N": 4096}]
SHAPES_SMOKE = [{"M": 1, "N": 1}, {"M": 7, "N": 300}, {"M": 3, "N": 5000}]
DTYPES = {"cuda": torch.bfloat16, "interpret": torch.float32}
TOLERANCE = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2, "l2": 1e-2},
    torch.float32: {"atol": 1e-6, "rtol": 1e-6, "l2": 1e-6},
}


def reference(x):
    return x * 2


def make_inputs(shape, dtype, device, generator):
    return (torch.randn(shape["M"], shape["N"], device=device, generator=generator).to(dtype),)


def flops(shape):
    return shape["M"] * shape["N"]


def bytes(shape, dtype):  # noqa: A001
    return 2.0 * shape["M"] * shape["N"] * torch.empty((), dtype=dtype).element_size()
'''

CANDIDATE = """\
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)


def kernel(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    _scale[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
"""


@pytest.fixture
def extra(tmp_path: Path) -> tuple[dict[str, str], Path]:
    problems_dir = tmp_path / "problems"
    problems_dir.mkdir()
    (problems_dir / "rowscale.py").write_text(ROWSCALE)
    return {"AUTOWEB_PROBLEM_DIRS": str(problems_dir)}, tmp_path


def test_problems_lists_a_problem_from_autoweb_problem_dirs(extra) -> None:
    env, _ = extra

    res = cli("problems", env=env)

    assert res.returncode == 0, res.stderr
    assert any(line.split()[:2] == ["rowscale", "kernel(x)"] for line in res.stdout.splitlines())
    assert all(name in res.stdout for name in BUILTINS)


@pytest.mark.parametrize(
    ("factor", "code", "verdict"), [(2.0, 0, "accepted"), (3.0, 1, "rejected")]
)
def test_evaluate_judges_a_candidate_against_the_extra_problems_reference(
    extra, factor: float, code: int, verdict: str
) -> None:
    env, tmp = extra
    cand = tmp / "scale.py"
    cand.write_text(CANDIDATE.replace("FACTOR", repr(factor)))
    out = tmp / "report.json"

    res = evaluate_cli("rowscale", cand, out, env=env)

    assert res.returncode == code, res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert report["problem"] == "rowscale"
    assert report["verdict"] == verdict, report["reasons"]
    assert len(report["shapes"]) == 3
    if verdict == "rejected":
        assert report["failure"] == "incorrect"


def test_sigterm_stops_the_sandboxed_child_with_the_command(tmp_path):
    # A child runs in its own session: without the command's handler it outlived a `kill`
    # (or `timeout`) of the command and spun on.
    import psutil

    spin = tmp_path / "spin.py"
    spin.write_text("import torch\n\n\ndef kernel(x):\n    while True:\n        pass\n")
    cmd = [sys.executable, "-m", "kernels", "evaluate", "--problem", "softmax"]
    cmd += ["--candidate", str(spin), "--device", "interpret", "--timeout", "300", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        children: list[psutil.Process] = []
        while not children and time.monotonic() < deadline:
            time.sleep(0.5)
            children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "no sandboxed child started"
        time.sleep(3)  # into the candidate's loop
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.pid for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
