"""benchmarks/search_proof.py on the CPU interpreter: every phase runs end to end on the user's
problem (smoke shapes, nothing timed), and the JSON it writes holds what
docs/benchmarks/search.md reads from it. The figures themselves come from a GPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.protocol import FAULT_ATTEMPTS
from tests.benchmarks import ROOT, run_script


def test_every_phase_runs_and_the_json_says_how_the_screening_was_scheduled(
    tmp_path: Path,
) -> None:
    out = tmp_path / "search.json"

    res = run_script(
        "search_proof.py",
        *("--out", str(out), "--device", "interpret"),
        *("--problems-dir", "benchmarks/user_problems", "--problem", "token_logprobs"),
        *("--before", "1", "--throughput", "2", "--jobs", "1", "--ahead", "1"),
        *("--linger", "20", "--stagger", "0.5", "--trials", "2", "--tune-minutes", "1"),
        "--reuse-baselines",
        timeout=600,
    )

    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data["before"]["evaluations"] == 1
    after = data["after"]
    assert after["evaluations"] == after["accepted"] == 2
    assert (after["jobs"], after["ahead"], after["linger_s"], after["lingered"]) == (1, 1, 20, 0)
    assert after["stagger_s"] == 0.5
    assert len(after["timelines"]) == len(after["gpu_wait"]) == 2
    # As `kernels tune` keeps them: as many warm sandboxes as begin at once (one on the GPU,
    # one ahead, one lingering) and one more started first, then --ahead and 2 kept idle.
    assert data["pool"] == {"first": 4, "idle": 3}
    # No attempt faulted: each verdict came on its first, begun when its call did.
    assert after["faulted_attempts"] == 0 and after["harness_faults"] == [[], []]
    assert [len(a) for a in after["attempts_at"]] == [1, 1]
    # What benchmarks/run_phases.py reads: when each started, and its child's CPU seconds.
    assert len(after["started_at"]) == 2 and all(0 <= s < 600 for s in after["started_at"])
    assert all(cpu["compiling"] > 0 for cpu in after["cpu_timelines"]), after["cpu_timelines"]
    assert "caller_median_percent_of_a_core" in after["host_cpu"]
    assert data["tune"]["evaluations"] == 2 and data["tune"]["lingered"] == 0
    assert "after:" in res.stdout


LINGER_OR_STAGGER = "is a number of seconds above 0, or 0 to turn it off"
POOL_IDLE = "is a whole number of warm sandboxes, at least 1"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--linger", "-1", LINGER_OR_STAGGER),
        ("--stagger", "-1", LINGER_OR_STAGGER),
        ("--pool-idle", "0", POOL_IDLE),
        ("--pool-idle", "-2", POOL_IDLE),
    ],
)
def test_a_bad_flag_is_refused_before_anything_runs(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    res = run_script(
        "search_proof.py",
        *("--out", str(tmp_path / "x.json"), "--device", "interpret", flag, value),
        timeout=300,
    )

    assert res.returncode == 2
    assert f"{flag} {message}" in res.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_run_stopped_by_sigterm_keeps_what_finished(tmp_path: Path) -> None:
    """`timeout` ends a run that outlasts its limit with SIGTERM: the screening phase's figures
    are then those of the evaluations finished by then, and the JSON says it was stopped."""
    out = tmp_path / "search.json"
    proc = subprocess.Popen(
        [sys.executable, "benchmarks/search_proof.py", "--out", str(out), "--device", "interpret"]
        + ["--problems-dir", "benchmarks/user_problems", "--problem", "token_logprobs"]
        + ["--before", "0", "--throughput", "12", "--jobs", "1", "--ahead", "0"]
        + ["--trials", "0", "--reuse-baselines"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "[  2/12]" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    log = "".join(lines) + rest

    assert proc.returncode == 124, log
    assert "stopped by SIGTERM" in log
    data = json.loads(out.read_text())
    after = data["after"]
    assert after["stopped"] == "SIGTERM" and data["stopped"] == "SIGTERM"
    assert 2 <= after["evaluations"] < 12
    assert len(after["started_at"]) == len(after["done_at"]) == after["evaluations"]
    assert after["per_minute"] > 0


def test_an_evaluation_the_harness_cannot_check_is_not_counted_as_a_verdict(
    tmp_path: Path,
) -> None:
    # A problem whose float64 reference runs the screening process out of memory every time:
    # each configuration is tried three times, then listed as not judged. The run goes on,
    # and its rates count verdicts only.
    out = tmp_path / "search.json"

    res = run_script(
        "search_proof.py",
        *("--out", str(out), "--device", "interpret"),
        *("--problems-dir", "tests/fixtures/problems", "--problem", "softmax_oom"),
        *("--before", "0", "--throughput", "1", "--jobs", "1", "--ahead", "0"),
        *("--trials", "0", "--reuse-baselines"),
        timeout=600,
    )

    assert res.returncode == 0, res.stdout + res.stderr
    after = json.loads(out.read_text())["after"]
    assert after["evaluations"] == 0 and after["accepted"] == 0
    assert len(after["not_judged"]) == 1
    assert "this process ran out of memory" in after["not_judged"][0]
    assert "[  1/1]" in res.stdout and "not judged" in res.stdout
    # Each failed attempt is logged when it fails and counted: its time is in the rate.
    assert after["faulted_attempts"] == FAULT_ATTEMPTS
    for k in range(1, FAULT_ATTEMPTS + 1):
        assert f"attempt {k} not judged: " in res.stdout, res.stdout
