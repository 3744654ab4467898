"""The chart builders (searches.charts) on trials recorded from real H200 runs, through the
chart selectors (searches.chart_data): right traces, axes, units, empty states, decimation."""

from __future__ import annotations

import math

import pytest

from searches import chart_data, charts
from searches.models import Trial
from tests.web import h200_trials

pytestmark = pytest.mark.django_db


@pytest.fixture
def recorded(engineer):
    h200_trials.record_worker()
    searches = h200_trials.record_tuner_searches(engineer)
    searches["exploits"] = h200_trials.record_exploit_search(engineer)
    return searches


def trace(figure, name):
    matches = [t for t in figure["data"] if t.get("name") == name]
    assert matches, f"no trace {name!r} in {charts.trace_names(figure)}"
    return matches[0]


# -- speedup per problem -------------------------------------------------------------------------


def test_speedup_per_problem_shows_best_found_per_problem_on_a_log_axis(recorded):
    found = chart_data.best_found_by_kind()
    assert set(found) == {"h200"}
    figure = charts.speedup_by_problem(
        "h200", found["h200"], chart_data.releases_by_kind().get("h200", [])
    )

    eager = trace(figure, "best found vs eager PyTorch")
    compiled = trace(figure, "best found vs torch.compile")
    # Every problem of the H200 run had a kept trial with a real speedup.
    assert sorted(eager["x"]) == sorted(h200_trials.proof_b()["problems"])
    assert figure["layout"]["yaxis"]["type"] == "log"
    assert figure["layout"]["yaxis"]["ticksuffix"] == "×"
    assert figure["layout"]["shapes"][0]["y0"] == 1  # the 1× line
    # rmsnorm's seed was measured at 8.86× eager on the H200: the best found is at least that.
    rms = dict(zip(eager["x"], eager["y"], strict=True))["rmsnorm"]
    assert (
        rms
        >= h200_trials.proof_b()["problems"]["rmsnorm"]["seed"]["summary"]["geomean_speedup_eager"]
        - 1e-9
    )
    assert all(url.startswith("/searches/") for url, _ in eager["customdata"])
    assert compiled["x"]  # the full reports carry torch.compile speedups
    # No library yet: the chart says so instead of silently omitting the series.
    assert figure["layout"]["meta"]["releases"] == 0
    assert "No releases on h200 yet" in figure["layout"]["annotations"][0]["text"]


def test_speedup_per_problem_draws_releases_when_the_library_provides_them(recorded):
    found = chart_data.best_found_by_kind()["h200"]
    released = [
        {
            "problem": "softmax",
            "speedup_eager": 1.3,
            "speedup_compiled": 1.2,
            "label": "r1",
            "url": "/x",
        }
    ]
    figure = charts.speedup_by_problem("h200", found, released)
    assert trace(figure, "best released vs eager PyTorch")["x"] == ["softmax"]
    assert not figure["layout"].get("annotations")  # plotly leaves out an empty list


def test_releases_are_empty_until_the_library_app_exists():
    assert chart_data.releases() == []
    assert chart_data.releases_by_kind() == {}


def test_speedup_per_problem_without_data_is_an_explicit_empty_state():
    figure = charts.speedup_by_problem("h200", [], [])
    assert charts.is_empty(figure)
    assert figure["data"] == []
    assert "No timed kept trial" in figure["layout"]["meta"]["message"]
    assert figure["layout"]["annotations"][0]["text"] == figure["layout"]["meta"]["message"]


# -- progress and budget -----------------------------------------------------------------------


def test_progress_colours_every_judged_trial_by_verdict_with_an_exact_incumbent(recorded):
    search = recorded["rope"]
    rows = chart_data.progress_rows(search)
    figure = charts.search_progress(rows)
    statuses = {r["status"] for r in rows}
    assert {"kept", "failed"} <= statuses

    kept = trace(figure, "kept")
    assert kept["marker"]["color"] == charts.VERDICT_COLOURS["kept"]
    failed = trace(figure, "failed")
    assert failed["yaxis"] == "y2" and failed["y"] == ["crashed"]  # the real OOM on the H200
    incumbent = trace(figure, "incumbent")
    assert incumbent["line"]["shape"] == "hv"
    kept_trials = list(
        Trial.objects.filter(search=search, status="kept")
        .order_by("index")
        .values_list("index", "speedup_eager")
    )
    assert (
        list(zip(incumbent["x"], incumbent["y"], strict=False))[: len(kept_trials)] == kept_trials
    )
    assert incumbent["x"][-1] == rows[-1]["index"]  # the line runs to the last trial
    assert figure["layout"]["yaxis"]["type"] == "log"
    assert figure["layout"]["xaxis"]["title"]["text"] == "trial"
    shown = sum(len(t["x"]) for t in figure["data"] if t["name"] != "incumbent")
    assert shown == len(rows) == figure["layout"]["meta"]["trials"]
    assert figure["layout"]["meta"]["decimated"] == 0


def test_progress_puts_every_failure_category_in_the_strip(recorded):
    figure = charts.search_progress(chart_data.progress_rows(recorded["exploits"]))
    failed = trace(figure, "failed")
    expected = {e["failure"] for e in h200_trials.proof_a()["exploits"] if e["failure"]}
    assert set(failed["y"]) == expected
    assert set(figure["layout"]["yaxis2"]["categoryarray"]) == expected
    assert len(failed["x"]) == 38


def test_progress_without_judged_trials_says_so():
    figure = charts.search_progress([{"index": 1, "status": "queued"}])
    assert charts.is_empty(figure)
    assert "No trial has been judged yet" in figure["layout"]["meta"]["message"]


def synthetic_trials(n: int, every_kept: int = 97) -> list[dict]:
    rows = []
    best = 1.0
    for i in range(1, n + 1):
        if i % every_kept == 0:
            best *= 1.01
            rows.append({"index": i, "status": "kept", "speedup_eager": best, "url": f"/t/{i}"})
        elif i % 5 == 0:
            rows.append({"index": i, "status": "failed", "failure": "incorrect"})
        else:
            rows.append({"index": i, "status": "reverted", "speedup_eager": best * 0.9})
    return rows


def test_ten_thousand_trials_are_decimated_deterministically_keeping_every_kept_one():
    rows = synthetic_trials(10_000)
    figure = charts.search_progress(rows)
    again = charts.search_progress(rows)
    assert figure == again  # deterministic
    meta = figure["layout"]["meta"]
    assert meta["trials"] == 10_000
    assert meta["shown"] <= charts.MAX_POINTS
    assert meta["decimated"] == 10_000 - meta["shown"]
    kept_rows = [r["index"] for r in rows if r["status"] == "kept"]
    assert trace(figure, "kept")["x"] == kept_rows  # every kept trial
    incumbent = trace(figure, "incumbent")
    assert incumbent["x"][:-1] == kept_rows and incumbent["x"][-1] == 10_000  # exact line
    assert "showing" in figure["layout"]["annotations"][0]["text"]
    shown_x = sorted(x for t in figure["data"] if t["name"] != "incumbent" for x in t["x"])
    assert shown_x[0] == 1 and shown_x[-1] == 10_000  # the sample spans the search
    # Large traces use WebGL so the page stays responsive.
    assert trace(figure, "reverted")["type"] in ("scatter", "scattergl")


def test_decimate_keeps_rows_under_the_limit_untouched():
    rows = synthetic_trials(50)
    assert charts.decimate(rows, 100) == (rows, 0)
    kept, dropped = charts.decimate(rows, 10)
    assert dropped == 50 - len(kept)
    assert all(r in kept for r in rows if r["status"] == "kept")


def test_budget_burndown_runs_down_from_the_ideas_budget(recorded):
    search = recorded["exploits"]
    events = chart_data.burndown_events(search)
    figure = charts.budget_burndown(search.budget(), events)
    trials = trace(figure, "trials")
    assert trials["y"][0] == 100.0
    # 39 of the idea's 200 trials used.
    assert trials["y"][-1] == pytest.approx(100 * (1 - 39 / 200), abs=0.01)
    tokens = {t["name"] for t in figure["data"]}
    assert {"trials", "GPU minutes", "wall time"} <= tokens
    assert figure["layout"]["yaxis"]["ticksuffix"] == "%"
    assert figure["layout"]["xaxis"]["title"]["text"] == "wall minutes since start"


def test_budget_burndown_before_any_trial_is_empty(search):
    assert charts.is_empty(charts.budget_burndown(search.budget(), []))


# -- roofline ----------------------------------------------------------------------------------


def test_roofline_places_accepted_trials_under_the_measured_roofs(recorded):
    ceilings = chart_data.ceilings_by_kind()["h200"]
    assert ceilings["copy_gbps"] == h200_trials.proof_b()["ceilings"]["copy_gbps"]
    points, left_out = chart_data.roofline_points("h200")
    assert left_out == 0
    figure = charts.roofline("h200", ceilings, points)
    roof = figure["data"][0]
    assert roof["name"] == "measured roof"
    notes = [a["text"] for a in figure["layout"]["annotations"]]
    assert "roof: copy 4,197 GB/s, bf16 matmul 785 TFLOP/s" in notes
    assert roof["y"][1] == ceilings["matmul_tflops_bf16"]
    assert figure["layout"]["xaxis"]["type"] == "log" and figure["layout"]["yaxis"]["type"] == "log"
    assert "FLOP/byte" in figure["layout"]["xaxis"]["title"]["text"]
    assert "TFLOP/s" in figure["layout"]["yaxis"]["title"]["text"]
    softmax = trace(figure, "softmax")
    assert all(url.startswith("/searches/") for url, _ in softmax["customdata"])
    assert "click to open the trial" in softmax["hovertemplate"]
    bw, peak = ceilings["copy_gbps"], ceilings["matmul_tflops_bf16"]
    for t in figure["data"][1:]:
        for x, y in zip(t["x"], t["y"], strict=True):
            # Honest kernels stay under the roof (the harness rejects beyond-roofline results).
            assert y <= min(x * bw / 1e3, peak) * 1.01
    # matmul is compute-heavy, softmax memory-bound: far apart on the intensity axis.
    assert min(trace(figure, "matmul")["x"]) > 100 * max(softmax["x"])


def test_roofline_intensity_matches_the_reports_own_arithmetic_intensity(recorded):
    report = h200_trials.proof_b()["problems"]["matmul"]["seed"]
    work = chart_data.problem_work(report)
    per_shape = [s["arithmetic_intensity"] for s in report["shapes"]]
    geo = math.exp(sum(map(math.log, per_shape)) / len(per_shape))
    assert work["flops"] / work["bytes"] == pytest.approx(geo, rel=1e-6)


def test_roofline_without_ceilings_or_points_is_empty():
    assert charts.is_empty(charts.roofline("b200", None, []))
    figure = charts.roofline("b200", {"copy_gbps": 8000, "matmul_tflops_bf16": 2250}, [])
    assert not charts.is_empty(figure)
    assert any("No timed accepted candidate" in a["text"] for a in figure["layout"]["annotations"])


# -- failure taxonomy --------------------------------------------------------------------------


def test_failure_shares_compare_proposers_and_models(recorded):
    counts = chart_data.outcome_counts()
    figure = charts.failure_shares(counts)
    groups = set(trace(figure, "kept")["y"])
    assert groups == {"tuner", f"llm:{h200_trials.LLM_MODEL}"}
    prohibited = trace(figure, "prohibited")
    llm = f"llm:{h200_trials.LLM_MODEL}"
    share = dict(zip(prohibited["y"], prohibited["x"], strict=True))[llm]
    n = sum(1 for e in h200_trials.proof_a()["exploits"] if e["failure"] == "prohibited")
    assert share == pytest.approx(100 * n / 39, abs=0.01)
    assert figure["layout"]["xaxis"]["ticksuffix"] == "%"
    for group in groups:  # each bar sums to 100%
        total = sum(dict(zip(t["y"], t["x"], strict=True)).get(group, 0) for t in figure["data"])
        assert total == pytest.approx(100, abs=0.1)
    assert figure["layout"]["meta"]["failed"] == sum(
        1 for r in Trial.objects.filter(status="failed")
    )


def test_failures_over_time_buckets_by_hour(recorded):
    rows, bucket = chart_data.outcome_counts_over_time()
    figure = charts.failures_over_time(rows, bucket=bucket)
    assert bucket == "hour"
    assert figure["layout"]["xaxis"]["title"]["text"] == "hour (UTC)"
    assert "hack suspected" in charts.trace_names(figure)


def test_failure_charts_without_trials_are_empty(db):
    assert charts.is_empty(charts.failure_shares(chart_data.outcome_counts()))
    rows, bucket = chart_data.outcome_counts_over_time()
    assert charts.is_empty(charts.failures_over_time(rows, bucket=bucket))


# -- per-shape heatmap and cross-GPU -----------------------------------------------------------


def test_shape_heatmap_by_gpu_kind_uses_the_reports_shapes(recorded):
    shapes, columns = chart_data.heatmap_by_kind("softmax")
    report = h200_trials.proof_b()["problems"]["softmax"]["seed"]
    assert shapes == [s["label"] for s in report["shapes"]]
    figure = charts.shape_heatmap("softmax", shapes, columns, column_title="GPU kind")
    heat = figure["data"][0]
    assert heat["type"] == "heatmap" and heat["x"] == ["h200"]
    assert heat["zmid"] == 0  # 1× is white
    first = report["shapes"][0]["speedup_eager"]
    best = columns[0]["speedups"][shapes[0]]
    assert heat["z"][0][0] == pytest.approx(math.log2(best), abs=1e-3)
    assert heat["text"][0][0] == f"{best:.2f}×"
    assert first > 0


def test_shape_heatmap_by_kernel_lists_the_fastest_kept_trials(recorded):
    shapes, columns = chart_data.heatmap_by_kernel("softmax", "h200")
    assert columns and all(c["name"].startswith("#") for c in columns)
    assert not charts.is_empty(charts.shape_heatmap("t", shapes, columns, column_title="kernel"))


def test_shape_heatmap_without_shapes_is_empty():
    assert charts.is_empty(charts.shape_heatmap("t", [], [], column_title="GPU kind"))


def test_cross_gpu_groups_one_source_by_gpu_kind(recorded, engineer):
    # A second kind: the softmax seed's real H200 report relabelled, for grouping only.
    search = h200_trials._search(engineer, "softmax", target_kinds=["h100"])
    report = dict(h200_trials.proof_b()["problems"]["softmax"]["seed"])
    report["device"] = {**report["device"], "kind": "h100"}
    h200_trials._trial(search, "seed", report)  # the same source as the H200 seed trial
    kernels = chart_data.cross_gpu_kernels()
    assert len(kernels) == 1
    assert {r["kind"] for r in kernels[0]["runs"]} == {"h100", "h200"}
    figure = charts.cross_gpu(kernels)
    assert charts.trace_names(figure) == ["h100", "h200"]
    assert figure["layout"]["yaxis"]["type"] == "log"
    assert kernels[0]["label"].startswith("softmax ")


def test_cross_gpu_with_one_kind_says_no_kernel_ran_on_two(recorded):
    figure = charts.cross_gpu(chart_data.cross_gpu_kernels())
    assert charts.is_empty(figure)
    assert "more than one GPU kind" in figure["layout"]["meta"]["message"]
