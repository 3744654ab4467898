"""Per-shape composition (kernels.engine.compose): a kernel serves a shape only when it beats
the faster baseline beyond both noises; otherwise that baseline does."""

from __future__ import annotations

import pytest

from kernels.engine.compose import build, pick_candidates

LABELS = ["M=1", "M=128", "M=4096", "M=65536"]
SHAPES = [{"M": 1}, {"M": 128}, {"M": 4096}, {"M": 65536}]


def st(ms: float | None, spread: float = 0.01, passed: bool = True) -> dict | None:
    return None if ms is None else {"median": ms, "spread": spread, "passed": passed}


def base(eager: float | None, compiled: float | None, spread: float = 0.01) -> dict:
    return {"eager": st(eager, spread), "compiled": st(compiled, spread)}


def test_each_shape_goes_to_the_fastest_kernel_beyond_noise_else_to_the_faster_baseline() -> None:
    kernels = ["trial 3", "trial 7"]
    kernel_stats = [
        [st(0.0050), st(0.0100), st(0.300), st(2.00)],  # trial 3
        [st(0.0060), st(0.0080), st(0.330), st(1.99)],  # trial 7
    ]
    baselines = [
        base(0.0200, 0.0060),  # M=1: trial 3 beats compiled by 17%: kernel
        base(0.0090, 0.0085),  # M=128: trial 7 at 0.0080 vs 0.0085: 5.9% > 2% noise: kernel
        base(0.290, 0.500),  # M=4096: eager is the faster baseline and no kernel beats it
        base(4.00, 2.00),  # M=65536: 1.99 vs 2.00 is inside the noise: compiled serves
    ]

    table = build(LABELS, SHAPES, kernels, kernel_stats, baselines)

    serves = [(r["serve"], r["kernel"]) for r in table["shapes"]]
    assert serves == [
        ("kernel", "trial 3"),
        ("kernel", "trial 7"),
        ("eager", None),
        ("compiled", None),
    ]
    assert [r["ms"] for r in table["shapes"]] == [0.0050, 0.0080, 0.290, 2.00]
    assert table["shapes_on_kernels"] == 2
    # never slower than torch.compile on any shape, by construction
    assert all(r["speedup_compiled"] >= 1.0 for r in table["shapes"])
    assert table["shapes_at_or_above_compiled"] == table["shapes_with_compiled"] == 4
    expected = (0.0060 / 0.0050 * 0.0085 / 0.0080 * 0.500 / 0.290 * 1.0) ** 0.25
    assert table["geomean_speedup_compiled"] == pytest.approx(expected)
    # the best single kernel is worse than the table: it loses to eager at M=4096
    assert table["best_single"]["kernel"] == "trial 3"
    assert table["best_single"]["geomean_speedup_compiled"] < table["geomean_speedup_compiled"]


def test_a_kernel_wrong_on_a_shape_never_serves_it() -> None:
    kernel_stats = [[st(0.001, passed=False), st(0.002), st(0.1), st(1.0)]]
    baselines = [base(0.01, 0.01)] * 4

    table = build(LABELS, SHAPES, ["trial 1"], kernel_stats, baselines)

    assert table["shapes"][0]["serve"] == "compiled"
    assert table["shapes"][0]["best_kernel"] is None
    assert table["shapes"][1]["serve"] == "kernel"


def test_a_shape_without_a_compiled_baseline_compares_with_eager() -> None:
    kernel_stats = [[st(0.5), st(0.5), st(0.5), st(0.5)]]
    baselines = [base(1.0, None), base(0.4, None), base(1.0, 1.0), base(None, None)]

    table = build(LABELS, SHAPES, ["k"], kernel_stats, baselines)

    assert [r["serve"] for r in table["shapes"]] == ["kernel", "eager", "kernel", "kernel"]
    assert table["shapes"][0]["speedup_compiled"] is None
    assert table["shapes_with_compiled"] == 1
    assert table["geomean_speedup_compiled"] is None  # not every shape had torch.compile


def test_candidates_for_the_table_are_the_per_shape_leaders_and_the_best_geomean() -> None:
    def report(ms: list[float], verdict: str = "accepted") -> dict:
        gm = 1.0
        for x in ms:
            gm *= x
        return {
            "verdict": verdict,
            "summary": {"geomean_ms": gm ** (1 / len(ms))},
            "shapes": [{"candidate_ms": x} for x in ms],
        }

    reports = [
        report([1.0, 1.0, 1.0, 1.0]),  # 0: best geomean, leads shape 3
        report([0.5, 2.0, 2.0, 2.0]),  # 1: leads shape 0
        report([2.0, 0.5, 0.5, 2.0]),  # 2: leads shapes 1 and 2
        report([0.1, 0.1, 0.1, 0.1], verdict="rejected"),  # never
        {},  # a failed trial has no report
    ]

    # most shapes led first; ties by geomean
    assert pick_candidates(reports) == [2, 0, 1]
    # the best geomean is always in, even when it leads fewer shapes than the limit allows
    assert pick_candidates(reports, limit=1) == [0]
    assert pick_candidates([{}, reports[3]]) == []
