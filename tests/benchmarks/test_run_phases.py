"""benchmarks/run_phases.py: where a screening run's evaluations spent their time. Checked on
runs small enough to work out by hand, and on a recorded one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import run_phases  # noqa: E402

from tests.benchmarks import run_script  # noqa: E402


def _run() -> dict:
    """Four evaluations, two on the GPU at a time; the fourth never reached it."""
    tl = {"compiling": 0.0, "want_gpu": 1.0, "verifying": 1.5, "benchmarking": 5.0}
    return {
        "evaluations": 4,
        "jobs": 1,
        "minutes": 0.5,
        "started_at": [0.0, 0.0, 6.0, 6.0],
        "done_at": [6.5, 6.6, 12.5, 30.0],
        "timelines": [
            {**tl, "gpu_done": 5.5, "done": 6.5},
            {**tl, "gpu_done": 6.5, "done": 6.6},
            {**tl, "gpu_done": 5.5, "done": 6.5},
            {"compiling": 0.0, "done": 30.0},
        ],
        "cpu_timelines": [
            {"compiling": 2.0, "want_gpu": 3.0, "verifying": 3.1, "benchmarking": 3.9},
            None,
            {"compiling": 2.0, "want_gpu": 3.4},
            None,
        ],
        "gpu_wait": [{"held_exclusive_s": 0.5}, {"held_exclusive_s": 1.5}, None, None],
    }


def test_each_step_has_its_median_seconds_and_cpu_seconds_where_recorded() -> None:
    rows = {r["step"]: r for r in run_phases.steps(_run())}

    assert rows["compiling -> want_gpu"] == {
        "step": "compiling -> want_gpu",
        "n": 3,
        "seconds": 1.0,
        "cpu_seconds": pytest.approx(1.2),  # two recorded: 1.0 and 1.4
    }
    assert rows["verifying -> benchmarking"]["cpu_seconds"] == pytest.approx(0.8)
    assert rows["benchmarking -> gpu_done"]["seconds"] == 0.5  # 0.5, 1.5, 0.5
    assert rows["compiling -> done"] == {
        "step": "compiling -> done",
        "n": 1,
        "seconds": 30.0,
        "cpu_seconds": None,
    }


def test_timing_alone_is_the_exclusive_holds_over_the_wall_clock() -> None:
    assert run_phases.exclusive_share(_run()) == pytest.approx(2.0 / 30, abs=1e-3)
    assert run_phases.exclusive_share({"minutes": 1.0, "gpu_wait": [None]}) is None


def test_evaluations_on_the_gpu_at_once_are_averaged_over_the_steady_window() -> None:
    # The window runs from the first finish (6.5) to the last but one (12.5): the first two
    # are done with the GPU by then, the third is on it from 7.0 to 11.5.
    assert run_phases.on_gpu(_run()) == pytest.approx(4.5 / 6.0, abs=0.01)
    # A run that did not record when its evaluations started cannot say.
    assert run_phases.on_gpu({**_run(), "started_at": None}) is None
    early = {k: v for k, v in _run().items() if k not in ("started_at", "done_at")}
    assert run_phases.on_gpu(early) is None  # the first runs recorded neither


def test_evaluations_checking_their_timed_outputs_after_the_gpu_are_averaged_too() -> None:
    # Window 6.5-12.5: the third evaluation left the GPU at 11.5 and had its timed outputs
    # checked at 12.0; the first two had theirs checked before the window.
    run = _run()
    run["timelines"][0]["timed_verified"] = 6.0
    run["timelines"][2]["timed_verified"] = 6.0
    assert run_phases.after_gpu(run) == pytest.approx(0.5 / 6.0, abs=0.01)
    assert run_phases.after_gpu(_run()) is None  # no evaluation recorded the step
    assert run_phases.after_gpu({**_run(), "started_at": None}) is None


def test_the_timed_outputs_whose_reference_was_computed_early_are_counted() -> None:
    run = {
        "gpu_wait": [{"timed_early": 3}, {"timed_early": 1}, None, {}],
        "shape_ms": [[0.1, 0.2, 0.3], [0.1, 0.2, 0.3], [None, None, None], []],
    }
    assert run_phases.timed_early(run) == {"early": 4, "shapes_timed": 6}
    assert run_phases.timed_early(_run()) is None  # reports from before it was counted


def test_the_lock_shares_are_timing_and_the_drain_before_it_over_the_steady_window() -> None:
    # Window 6.5-12.5 (6 s). The third evaluation times from 11.0 to 11.5 after asking at 9.0;
    # the second's timing (5.0-6.5) and wait lie before the window.
    run = {
        **_run(),
        "gpu_wait": [{"exclusive_s": 1.0}, {"exclusive_s": 0.2}, {"exclusive_s": 2.0}, None],
    }
    assert run_phases.lock_shares(run) == {
        "timing": pytest.approx(0.5 / 6, abs=1e-3),
        "draining": pytest.approx(2.0 / 6, abs=1e-3),
    }
    # Waits that overlap another's timing count once: a phase asked for during another's
    # timing drains only from the end of that timing.
    run["gpu_wait"][2] = {"exclusive_s": 6.0}  # asked at 5.0, before the window: 6.5-11.0 left
    assert run_phases.lock_shares(run)["draining"] == pytest.approx(4.5 / 6, abs=1e-3)
    assert run_phases.lock_shares({**_run(), "started_at": None}) is None


def _trace() -> str:
    # A child's shape 0.0-2.0 and a check 1.0-3.0 are in progress when a timing phase asks at
    # 1.5; it gets the GPU at 3.0, when the check (the last of them) ends. A second timing phase
    # asks at 3.5 during the first and gets it at 4.0; a third asks at 5.5 with nothing in the
    # trace held, and gets it at 6.0 (a hold the trace lacks).
    return (
        "shared shared 0.0 0.0 2.0\n"
        "check shared 0.9 1.0 3.0\n"
        "exclusive exclusive 1.5 3.0 4.0\n"
        "exclusive exclusive 3.5 4.0 4.5\n"
        "shared shared 4.5 4.5 4.75\n"
        "exclusive exclusive 5.5 6.0 6.5\n"
        "cut off\n"
    )


def test_the_lock_trace_says_what_each_timing_phase_waited_for() -> None:
    locks = run_phases.lock_waits(run_phases.read_locks(_trace()))

    assert locks["held"]["shared"] == {"n": 2, "median": 2.0, "p90": 2.0, "max": 2.0, "sum": 2.25}
    assert locks["held"]["exclusive"]["sum"] == 2.0
    assert locks["timing_waited_for"] == {
        "check": {"n": 1, "median": 1.5, "p90": 1.5, "max": 1.5, "sum": 1.5},
        "exclusive": {"n": 1, "median": 0.5, "p90": 0.5, "max": 0.5, "sum": 0.5},
    }
    assert locks["shared_in_progress_when_timing_asked"] == pytest.approx(2 / 3, abs=0.01)


def test_the_lock_trace_says_what_held_the_gpu_over_time() -> None:
    # 0-1 a child alone, 1-2 a child and a check, 2-3 the check alone, 3-4.5 timing, 4.5-4.75
    # a child, 4.75-5.5 nothing, 5.5-6 nothing traced while a timing phase waits, 6-6.5 timing:
    # 6.5 s in all.
    shares = run_phases.lock_time(run_phases.read_locks(_trace()))

    assert shares == {
        "timing": pytest.approx(2.0 / 6.5, abs=1e-4),
        "children and checks": pytest.approx(1.0 / 6.5, abs=1e-4),
        "children alone": pytest.approx(1.25 / 6.5, abs=1e-4),
        "checks alone": pytest.approx(1.0 / 6.5, abs=1e-4),
        "nothing traced, timing waiting": pytest.approx(0.5 / 6.5, abs=1e-4),
        "free": pytest.approx(0.75 / 6.5, abs=1e-4),
    }
    assert run_phases.lock_time([]) is None


def _with_locks(run: str, trace: str):
    return run_script("run_phases.py", "docs/benchmarks/search/" + run, "--locks", trace)


def test_the_shapes_screening_stopped_lost_are_counted_where_recorded() -> None:
    run = {
        "shape_samples": [[6, 6, 12, None], [10, 6], []],
        "shape_lost": [[True, True, False, False], [False, True], []],
    }
    assert run_phases.lost_shapes(run) == {
        "timed": 5,
        "lost": 3,
        "median_samples_lost": 6,
        "median_samples_others": 11.0,
    }
    assert run_phases.lost_shapes(_run()) is None  # a run from before they were recorded


def test_the_references_each_oracle_computed_are_counted_where_recorded() -> None:
    run = {"references": [{"compiled": 40, "eager": 4}, {"compiled": 0, "eager": 44}, None]}
    assert run_phases.references(run) == {
        "evaluations": 2,
        "compiled": 40,
        "eager": 48,
        "evaluations_all_eager": 1,
    }
    assert run_phases.references(_run()) is None  # from before, or the compiled oracle off
    assert run_phases.references({"references": [None, None]}) is None


def test_the_command_line_reads_a_recorded_run(tmp_path: Path) -> None:
    res = run_script("run_phases.py", "docs/benchmarks/search/search-2026-12-05-g.json")

    assert res.returncode == 0, res.stderr
    assert "96 evaluations, jobs 12" in res.stdout
    assert "50.3 per minute, steady state 52.1" in res.stdout
    assert "preparing -> benchmarking" in res.stdout
    assert "steady window" not in res.stdout  # run g did not record when each started
    assert "the first verdict at 8.45 s, the first 12 by 22.48 s" in res.stdout
    assert "attempts the harness failed" not in res.stdout  # nor counted them

    res = run_script("run_phases.py", "docs/benchmarks/search/search-2026-12-05-h100-k8b.json")
    assert res.returncode == 0, res.stderr
    assert "the GPU held for timing 30% of it, draining for a timing phase 30%" in res.stdout

    trace = tmp_path / "locks.txt"
    trace.write_text(_trace())
    res = _with_locks("search-2026-12-05-h100-k8b.json", str(trace))
    assert res.returncode == 0, res.stderr
    assert "a timing phase waited for a check hold: n=1, median 1.500 s" in res.stdout
    assert "shared holds in progress when a timing phase asked: 0.67" in res.stdout
    res = _with_locks(
        "search-2026-12-06-h100-s1.json", "docs/benchmarks/search/locks-2026-12-06-h100-s1.txt.gz"
    )
    assert res.returncode == 0, res.stderr
    assert "the GPU held for timing 34% of it, draining for a timing phase 16%" in res.stdout
    assert "held check      n=3355, median 0.028 s" in res.stdout
    assert "the lock over the trace: timing " in res.stdout
    res = _with_locks(
        "search-2026-12-06-h100-d8.json", "docs/benchmarks/search/locks-2026-12-06-h100-d8.txt.gz"
    )
    assert res.returncode == 0, res.stderr
    assert "shapes timed 660, of which stopped lost 448 (median samples 6;" in res.stdout
    assert "held step-prepare-capture n=300, median 0.056 s" in res.stdout
    # Before and after the timed outputs' references were computed with the verification.
    res = run_script("run_phases.py", "docs/benchmarks/search/search-2026-12-06-h100-q1.json")
    assert res.returncode == 0, res.stderr
    assert "on the GPU at once 6.84, checking the timed outputs after it 1.93" in res.stdout
    assert "computed with their verification" not in res.stdout
    res = run_script("run_phases.py", "docs/benchmarks/search/search-2026-12-06-h100-p1.json")
    assert res.returncode == 0, res.stderr
    assert "on the GPU at once 8.32, checking the timed outputs after it 0.22" in res.stdout
    assert "references computed with their verification: 660 of 660 shapes" in res.stdout
    res = _with_locks("search-2026-12-05-g.json", str(tmp_path / "missing.txt"))
    assert res.returncode == 2
    assert "cannot read the lock trace" in res.stderr

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"before": {}}))
    res = run_script("run_phases.py", str(bad))
    assert res.returncode == 2
    assert "not a search_proof.py run (KeyError" in res.stderr


def test_the_first_verdicts_and_the_attempts_that_faulted_are_reported_where_recorded() -> None:
    run = {**_run(), "jobs": 2, "faulted_attempts": 3}
    s = run_phases.summary(run)
    assert s["first_verdicts"] == {"first_s": 6.5, "jobs_th_s": 6.6}
    assert s["faulted_attempts"] == 3
    old = run_phases.summary(_run())  # a run from before the attempts were counted
    assert old["faulted_attempts"] is None
    assert run_phases.summary({**_run(), "done_at": []})["first_verdicts"] is None
