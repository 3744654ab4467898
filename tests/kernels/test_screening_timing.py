"""When screening stops sampling a shape: once every median is tight, or, for a candidate, once
it has lost the shape beyond doubt to the faster baseline's cached time; and how the report
says so."""

from __future__ import annotations

import random

import pytest

from kernels import problems
from kernels.harness import baselines as bl
from kernels.harness import timing, verdict

TIGHT = [1.0, 1.001, 0.999, 1.0, 1.002, 0.998, 1.0, 1.001, 0.999, 1.0]


def test_a_shape_is_lost_at_six_samples_all_slower_than_the_bar() -> None:
    assert timing.LOSE_MIN_SAMPLES == 6
    # At six samples the distribution-free 95% interval of the median is their whole range.
    s = [2.0, 2.5, 3.0, 2.2, 2.8, 2.1]
    assert timing.median_ci(s) == pytest.approx((max(s) - min(s)) / (2 * 2.35))
    assert timing.lost(s, 1.9)
    assert not timing.lost(s[:5], 1.9)  # five are not enough
    assert not timing.lost(s, 2.0)  # the fastest is not slower than the bar
    assert not timing.lost([*s, 1.5], 1.9)  # one sample faster than the bar: not beyond doubt
    assert not timing.lost(s, None)


def test_a_losing_candidate_alone_stops_at_six_samples_long_before_the_budget() -> None:
    noisy = [5.0, 9.0, 6.0, 12.0, 7.0, 10.0]  # far from tight
    bars = {"candidate0": 1.0}
    assert not timing.screened({"candidate0": noisy[:5]}, 0.01, 0.5, 0.01, bars)
    assert timing.screened({"candidate0": noisy}, 0.01, 0.5, 0.01, bars)
    # Without a bar (a shape with no cached baseline, or a confirmation) it samples on.
    assert not timing.screened({"candidate0": noisy}, 0.01, 0.5, 0.01, {})


def test_the_canary_beside_a_losing_candidate_keeps_sampling_until_tight() -> None:
    # The eager baseline timed on the canary shape has no bar: it needs its ten samples and a
    # tight median, however early the candidate lost.
    bars = {"candidate0": 1.0}
    lost = {"candidate0": [3.0] * 6, "eager": TIGHT[:6]}
    assert not timing.screened(lost, 0.01, 0.5, 0.01, bars)
    assert timing.screened({"candidate0": [3.0] * 10, "eager": TIGHT}, 0.01, 0.5, 0.01, bars)
    noisy_eager = {"candidate0": [3.0] * 10, "eager": [1.0, 2.0] * 5}
    assert not timing.screened(noisy_eager, 0.01, 0.5, 0.01, bars)


def test_a_candidate_that_may_win_is_sampled_as_before() -> None:
    # Faster than the bar, or as fast on one sample: at least ten samples and a tight median,
    # or the budget.
    bars = {"candidate0": 1.5}
    assert not timing.screened({"candidate0": TIGHT[:6]}, 0.01, 0.5, 0.01, bars)
    assert timing.screened({"candidate0": TIGHT}, 0.01, 0.5, 0.01, bars)
    mixed = [3.0, 1.5, 3.2, 2.9, 3.1, 3.0, 2.8, 3.3]
    assert not timing.screened({"candidate0": mixed}, 0.01, 0.5, 0.01, bars)
    rng = random.Random(7)
    noisy = [rng.uniform(1.0, 3.0) for _ in range(10)]
    assert not timing.screened({"candidate0": noisy}, 0.4, 0.5, 0.01, {})
    assert timing.screened({"candidate0": noisy}, 0.6, 0.5, 0.01, {})  # the budget is spent
    assert not timing.screened({"candidate0": noisy[:9]}, 0.6, 0.5, 0.01, {})  # under ten


def test_the_bar_is_the_faster_baseline_of_each_shape() -> None:
    entries = [
        {"mode": "events", "eager": {"median": 2.0}, "compiled": {"median": 1.2}},
        {"mode": "graph", "eager": {"median": 0.5}, "compiled": None},  # no compiled graph
        {"mode": "events", "eager": {"median": 0.7}, "compiled": {"median": 0.9}},
    ]
    assert bl.bars(entries) == {"0": 1.2, "1": 0.5, "2": 0.7}


def _run(cached: list[dict] | None):
    import torch

    from kernels.harness.evaluation import _seeds

    problem = problems.load("softmax")
    shape = problem.shapes("smoke")[1]
    run = verdict.Run(problem, "cpu", [shape], _seeds(1), torch.float32, None)
    run.cached = cached
    return run, run.results[0]


def test_a_screened_shape_stopped_lost_says_which_time_it_lost_to() -> None:
    entry = {"mode": "events", "eager": {"median": 2.0, "spread": 0.01}, "compiled": None}
    run, row = _run([entry])
    st = {"median": 3.0, "spread": 0.02, "ci": 0.05, "n": 6, "slower_than_ms": 2.0}
    verdict._place(run, row, {"candidate0": st}, {})
    assert row["candidate_samples"] == 6
    assert row["candidate_slower_than_ms"] == 2.0
    assert row["speedup_eager"] == pytest.approx(2.0 / 3.0) and not row["win_eager"]

    run, row = _run([entry])
    verdict._place(run, row, {"candidate0": {**st, "n": 12, "slower_than_ms": None}}, {})
    assert "candidate_slower_than_ms" not in row
    # Outside a screening no bar is given, and a stray one is not reported.
    run, row = _run(None)
    verdict._place(run, row, {"candidate0": st, "eager": entry["eager"]}, {})
    assert "candidate_slower_than_ms" not in row
