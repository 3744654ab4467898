"""The chart selectors at scale: aggregates in the database, a bounded number of queries, and
decimation that keeps the right points.

The aggregate path is checked against a reference that reads every trial in Python (the
straightforward way, as the charts once did): on data where nothing is left out, both give the
same rows and so the same figures.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from searches import chart_data, charts, services
from searches.models import Trial
from tests.web import h200_trials
from tests.web.domain import idea_kwargs

pytestmark = pytest.mark.django_db

FAILURES = ("incorrect", "compile_error", "timeout")


def figures(html: str) -> dict[str, dict]:
    found = re.findall(
        r'<script id="(chart-[\w-]+)-data" type="application/json">(.*?)</script>', html, re.S
    )
    return {key: json.loads(body) for key, body in found}


# -- the reference: every trial, in Python ------------------------------------------------------


def reference_outcome_counts(kind: str | None = None) -> list[dict]:
    totals: Counter = Counter()
    for t in Trial.objects.filter(status__in=Trial.TERMINAL):
        if kind is None or t.device_kind == kind:
            outcome = t.failure or ("failed" if t.status == "failed" else t.status)
            totals[(chart_data.proposer_label(t.proposer, t.model), outcome)] += 1
    return [{"group": g, "outcome": o, "count": n} for (g, o), n in sorted(totals.items())]


def reference_over_time(kind: str | None = None) -> tuple[list[dict], str]:
    trials = [
        t
        for t in Trial.objects.filter(status__in=Trial.TERMINAL)
        if t.finished_at and (kind is None or t.device_kind == kind)
    ]
    if not trials:
        return [], "hour"
    times = [t.finished_at for t in trials]
    hourly = max(times) - min(times) <= timedelta(days=2)
    fmt = "%Y-%m-%d %H:00" if hourly else "%Y-%m-%d"
    totals: Counter = Counter()
    for t in trials:
        outcome = t.failure or ("failed" if t.status == "failed" else t.status)
        totals[(t.finished_at.astimezone(UTC).strftime(fmt), outcome)] += 1
    rows = [{"group": g, "outcome": o, "count": n} for (g, o), n in sorted(totals.items())]
    return rows, "hour" if hourly else "day"


def reference_kinds() -> list[str]:
    kinds = {t.device_kind for t in Trial.objects.all()}
    kinds |= {w.kind for w in chart_data.Worker.objects.all()}
    kinds |= {r["kind"] for r in chart_data.releases()}
    kinds.discard("")
    return sorted(kinds, key=lambda k: (k == chart_data.INTERPRET, k))


def reference_roofline(kind: str) -> list[dict]:
    """Every accepted, timed trial on `kind`, in id order, placed by the newest report of its
    problem that times each shape."""
    trials = [
        t
        for t in Trial.objects.filter(device_kind=kind, status__in=chart_data.ACCEPTED)
        .select_related("search__idea")
        .order_by("id")
        if t.geomean_ms is not None
    ]
    work: dict[str, dict | None] = {}
    for t in reversed(trials):
        name = t.search.idea.problem
        if work.get(name) is None and t.report is not None:
            work[name] = chart_data.problem_work(t.report)
    points = []
    for t in trials:
        w = work.get(t.search.idea.problem)
        if not w or not t.geomean_ms:
            continue
        rationale = t.rationale.strip().splitlines()
        label = f"trial {t.index} of search #{t.search_id}"
        if rationale:
            label += f": {chart_data.plotly_text(rationale[0][: chart_data.LABEL_CHARS])}"
        points.append(
            {
                "problem": t.search.idea.problem,
                "intensity": w["flops"] / w["bytes"],
                "tflops": w["flops"] / (t.geomean_ms * 1e-3) / 1e12,
                "status": t.status,
                "label": label,
                "url": chart_data.trial_url(t.search_id, t.index),
            }
        )
    return points


# -- data ---------------------------------------------------------------------------------------


@pytest.fixture
def recorded(engineer):
    """The real H200 runs (tuner searches, planted exploits), spread over several hours."""
    h200_trials.record_worker()
    out = h200_trials.record_tuner_searches(engineer)
    out["exploits"] = h200_trials.record_exploit_search(engineer)
    start = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    for n, pk in enumerate(Trial.objects.order_by("id").values_list("id", flat=True)):
        Trial.objects.filter(pk=pk).update(finished_at=start + timedelta(minutes=7 * n))
    return out


def new_search(engineer, problem: str = "softmax"):
    idea = services.create_idea(**idea_kwargs(engineer, problem=problem, max_trials=100_000))
    return services.begin_search(search=services.start_search(idea=idea, user=engineer))


def bulk(search, n: int, *, start: int = 1, geomean_ms=None, seed: int = 0) -> None:
    """`n` judged trials on an H200 with the real softmax report, a kept / reverted / failed
    mix and an hour apart, in a few queries."""
    rng = random.Random(seed)
    report = h200_trials.load("cli-softmax-seed-full.json")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    rows = []
    for i in range(start, start + n):
        source = f"# trial {search.pk}-{i}\n"
        status = ("kept", "reverted", "failed")[i % 3]
        failed = status == "failed"
        ms = geomean_ms(i) if geomean_ms else rng.uniform(0.01, 0.05)
        rows.append(
            Trial(
                search=search,
                index=i,
                source=source,
                source_sha256=hashlib.sha256(source.encode()).hexdigest(),
                proposer="tuner",
                rationale=f"BLOCK_N={2 ** (8 + i % 6)}",
                status=status,
                failure=FAILURES[i % len(FAILURES)] if failed else None,
                report=report,
                device_kind="h200",
                geomean_ms=None if failed else ms,
                speedup_eager=None if failed else rng.uniform(0.8, 3.0),
                speedup_compiled=None if failed else rng.uniform(0.7, 2.0),
                finished_at=t0 + timedelta(hours=i % 40),
            )
        )
    Trial.objects.bulk_create(rows, batch_size=500)


# -- the aggregates compute what every trial says ------------------------------------------------


def test_outcome_counts_in_sql_equal_counting_every_trial(recorded):
    assert chart_data.outcome_counts() == reference_outcome_counts() != []
    assert chart_data.outcome_counts(kind="h200") == reference_outcome_counts("h200")
    assert charts.failure_shares(chart_data.outcome_counts()) == charts.failure_shares(
        reference_outcome_counts()
    )


@pytest.mark.parametrize("minutes_apart, bucket", [(7, "hour"), (60 * 5, "day")])
def test_time_buckets_in_sql_equal_truncating_every_trial(recorded, minutes_apart, bucket):
    start = datetime(2026, 12, 1, 23, 50, tzinfo=UTC)  # buckets cross midnight
    for n, pk in enumerate(Trial.objects.order_by("id").values_list("id", flat=True)):
        Trial.objects.filter(pk=pk).update(finished_at=start + timedelta(minutes=minutes_apart * n))
    rows, got_bucket = chart_data.outcome_counts_over_time()
    expected = reference_over_time()
    assert (rows, got_bucket) == expected
    assert got_bucket == bucket
    assert len({r["group"] for r in rows}) > 2
    assert charts.failures_over_time(rows, bucket=bucket) == charts.failures_over_time(
        expected[0], bucket=expected[1]
    )
    assert chart_data.outcome_counts_over_time(kind="h200") == reference_over_time("h200")


def test_gpu_kinds_equal_the_kinds_of_every_trial(recorded, search):
    Trial.objects.filter(pk=Trial.objects.order_by("id").first().pk).update(device_kind="b200")
    assert chart_data.gpu_kinds() == reference_kinds()
    assert "b200" in chart_data.gpu_kinds()


def test_roofline_points_equal_placing_every_trial_when_none_is_left_out(recorded):
    points, left_out = chart_data.roofline_points("h200")
    assert left_out == 0
    assert points == reference_roofline("h200")
    assert len({p["problem"] for p in points}) > 3


def test_the_gpu_page_draws_the_same_figures_as_the_reference(recorded, engineer_client):
    found = figures(engineer_client.get(reverse("searches:gpus")).content.decode())
    ceilings = chart_data.ceilings_by_kind()["h200"]
    assert found["chart-roofline-h200"] == charts.roofline(
        "h200", ceilings, reference_roofline("h200")
    )
    assert found["chart-kind-h200-failures"] == charts.failure_shares(
        reference_outcome_counts("h200")
    )
    rows, bucket = reference_over_time("h200")
    assert found["chart-kind-h200-failures-time"] == charts.failures_over_time(rows, bucket=bucket)


# -- decimation keeps the right points ----------------------------------------------------------


def test_the_roofline_keeps_the_fastest_of_each_problem_and_counts_the_rest(engineer):
    softmax, rope = new_search(engineer), new_search(engineer, "rope")
    # Accepted softmax trials (two in three) get distinct times, shuffled over the indices,
    # and two share the fastest time: the older one ranks first.
    times = list(range(1, 61))
    random.Random(1).shuffle(times)
    bulk(softmax, 60, geomean_ms=lambda i: 0.001 * times[i - 1])
    Trial.objects.filter(search=softmax, index=2).update(geomean_ms=0.0005)
    Trial.objects.filter(search=softmax, index=4).update(geomean_ms=0.0005)
    bulk(rope, 6)
    accepted = Trial.objects.filter(status__in=("kept", "reverted"))
    fastest = list(
        accepted.filter(search=softmax).order_by("geomean_ms", "id").values_list("id", flat=True)
    )

    points, left_out = chart_data.roofline_points("h200", per_problem=10)

    assert left_out == accepted.count() - 10 - accepted.filter(search=rope).count() == 30
    shown = {p["url"] for p in points if p["problem"] == "softmax"}
    assert shown == {
        chart_data.trial_url(t.search_id, t.index)
        for t in Trial.objects.filter(id__in=fastest[:10])
    }
    everything = reference_roofline("h200")
    softmax_all = [p for p in everything if p["problem"] == "softmax"]
    # The best candidate is never left out, and every dropped one is slower than every shown one.
    assert max(p["tflops"] for p in points) == max(p["tflops"] for p in softmax_all)
    dropped = [p for p in softmax_all if p["url"] not in shown]
    assert max(p["tflops"] for p in dropped) < min(
        p["tflops"] for p in points if p["problem"] == "softmax"
    )
    assert [p for p in points if p["problem"] == "rope"] == [
        p for p in everything if p["problem"] == "rope"
    ]
    assert points == sorted(points, key=lambda p: everything.index(p))  # trial order

    figure = charts.roofline("h200", None, points, left_out=left_out, per_problem=10)
    assert figure["layout"]["meta"]["points"] == 44
    assert figure["layout"]["meta"]["shown"] == 14
    assert figure["layout"]["meta"]["decimated"] == 30
    notes = [a["text"] for a in figure["layout"]["annotations"]]
    assert "showing 14 of 44 candidates: the 10 fastest of each problem" in notes


def test_the_gpu_page_with_thousands_of_candidates_stays_small(engineer, engineer_client):
    bulk(new_search(engineer), 3000)
    body = engineer_client.get(reverse("searches:gpus")).content.decode()
    roofline = figures(body)["chart-roofline-h200"]
    meta = roofline["layout"]["meta"]
    assert meta["points"] == 2000  # two in three are accepted and timed
    assert meta["shown"] == chart_data.ROOFLINE_PER_PROBLEM
    assert len(body) < 100_000


# -- a bounded number of queries ----------------------------------------------------------------


def count_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


@pytest.mark.parametrize("page", ["searches:dashboard_charts", "searches:gpus"])
def test_the_chart_pages_take_as_many_queries_for_1000_trials_as_for_100(
    engineer, engineer_client, page
):
    h200_trials.record_worker()
    search = new_search(engineer)
    bulk(search, 100)
    small = count_queries(engineer_client, reverse(page))
    bulk(search, 900, start=101, seed=1)
    assert count_queries(engineer_client, reverse(page)) == small
