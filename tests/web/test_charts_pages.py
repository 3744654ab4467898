"""The chart pages and sections: the GPUs page, the lazily loaded chart sections of the dashboard,
the search page and the problem page, the search's live JSON, access, empty states."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from searches import charts
from searches.models import Trial
from tests.web import h200_trials
from tests.web.domain import accepted, interpreted, judge, propose
from tests.web.pages import HOSTILE, HOSTILE_RAW, assert_inert

pytestmark = pytest.mark.django_db


def figures(html: str) -> dict[str, dict]:
    """Every embedded figure by its element id (json_script output)."""
    found = re.findall(
        r'<script id="(chart-[\w-]+)-data" type="application/json">(.*?)</script>', html, re.S
    )
    return {key: json.loads(body) for key, body in found}


@pytest.fixture
def recorded(engineer):
    h200_trials.record_worker()
    out = h200_trials.record_tuner_searches(engineer, ["softmax", "matmul", "rope"])
    out["exploits"] = h200_trials.record_exploit_search(engineer)
    return out


def test_the_gpus_page_has_one_section_per_kind_with_speedups_roofline_and_failures(
    engineer_client, recorded
):
    html = engineer_client.get(reverse("searches:gpus")).content.decode()
    assert 'id="gpu-h200"' in html
    assert "copy 4197 GB/s" in html  # the measured ceiling, from the worker
    shown = figures(html)
    assert {
        "chart-speedup-h200",
        "chart-roofline-h200",
        "chart-kind-h200-failures",
        "chart-kind-h200-failures-time",
        "chart-cross-gpu",
    } <= set(shown)
    assert not charts.is_empty(shown["chart-roofline-h200"])
    assert charts.is_empty(shown["chart-cross-gpu"])
    assert "No kernel has been timed on more than one GPU kind yet." in html  # shown as text
    assert 'href="/gpus"' in html  # the nav link


def test_the_gpus_page_without_any_data_says_so(engineer_client):
    html = engineer_client.get(reverse("searches:gpus")).content.decode()
    assert 'id="no-gpu-kinds"' in html
    assert "No GPU kind yet" in html


def test_the_gpus_page_shows_the_interpreter_without_timed_charts(engineer_client, search):
    trial = propose(search, 1)
    judge(trial, interpreted())
    html = engineer_client.get(reverse("searches:gpus")).content.decode()
    assert 'id="gpu-interpret"' in html
    assert "no timings" in html
    assert "chart-roofline-interpret" not in html
    assert "chart-kind-interpret-failures" in html


def test_charts_are_for_engineers(outsider_client):
    html = outsider_client.get(reverse("searches:gpus")).content.decode()
    assert (
        "shown to engineers" in html
        and "chart-" not in html.split("<main")[1].split("charts-engineers-only")[0]
    )
    for url in (
        reverse("searches:dashboard_charts"),
        reverse("searches:problem_charts", args=["softmax"]),
    ):
        response = outsider_client.get(url)
        assert response.status_code == 200
        assert "shown to engineers" in response.content.decode()
        assert "application/json" not in response.content.decode()


def test_an_anonymous_visitor_is_sent_to_login(client, search):
    for url in (
        reverse("searches:gpus"),
        reverse("searches:dashboard_charts"),
        reverse("searches:search_charts", args=[search.pk]),
    ):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_the_search_charts_of_an_outsider_are_refused(outsider_client, search):
    assert (
        outsider_client.get(reverse("searches:search_charts", args=[search.pk])).status_code == 403
    )


def test_pages_load_their_chart_sections_and_plotly_locally(engineer_client, search):
    for url, slot in (
        (reverse("searches:dashboard"), reverse("searches:dashboard_charts")),
        (
            reverse("searches:search", args=[search.pk]),
            reverse("searches:search_charts", args=[search.pk]),
        ),
        (
            reverse("searches:problem", args=["softmax"]),
            reverse("searches:problem_charts", args=["softmax"]),
        ),
    ):
        html = engineer_client.get(url).content.decode()
        assert f'hx-get="{slot}" hx-trigger="load"' in html, url
        assert '<script src="/static/vendor/plotly-4.1.1.min.js" defer>' in html, url
        sources = re.findall(r'<script src="([^"]+)"', html)
        assert sources and all(src.startswith("/static/") for src in sources), url  # no CDN
    # plotly.js itself is served by this site.
    from django.contrib.staticfiles import finders

    assert finders.find("vendor/plotly-4.1.1.min.js")
    assert finders.find("js/charts.js")


def test_the_dashboard_charts_show_speedups_per_kind_and_failures(engineer_client, recorded):
    html = engineer_client.get(reverse("searches:dashboard_charts")).content.decode()
    shown = figures(html)
    assert set(shown) == {"chart-speedup-h200", "chart-all-failures", "chart-all-failures-time"}
    speedups = shown["chart-speedup-h200"]
    assert sorted(speedups["data"][0]["x"]) == ["matmul", "rope", "softmax"]
    assert "No releases on h200 yet" in json.dumps(speedups["layout"]["annotations"])


def test_the_dashboard_charts_without_data_are_empty_states_not_blank_boxes(engineer_client):
    html = engineer_client.get(reverse("searches:dashboard_charts")).content.decode()
    shown = figures(html)
    assert shown and all(charts.is_empty(f) for f in shown.values())
    assert "No GPU kind has timed results yet" in html
    assert "No judged trial yet" in html
    assert html.count('class="chart-plot" role="img"') == len(shown)
    assert html.count(" hidden></div>") == len(shown)  # every plot box hidden, message shown


def test_the_search_charts_show_progress_budget_and_failures(engineer_client, recorded):
    search = recorded["exploits"]
    url = reverse("searches:search_charts", args=[search.pk])
    html = engineer_client.get(url).content.decode()
    assert f'data-live-url="{url}?format=json"' in html
    shown = figures(html)
    assert {"chart-progress", "chart-burndown", "chart-search-failures"} <= set(shown)
    progress = shown["chart-progress"]
    assert progress["layout"]["meta"]["trials"] == 39
    live = engineer_client.get(url, {"format": "json"}).json()
    assert live["charts"]["chart-progress"] == progress  # one source for the page and the stream


def test_hostile_rationales_are_inert_in_chart_data(engineer_client, search):
    trial = propose(search, 1, rationale=HOSTILE)
    judge(trial, accepted())
    url = reverse("searches:search_charts", args=[search.pk])
    html = engineer_client.get(url).content.decode()
    for raw in HOSTILE_RAW:
        assert raw not in html
    # Escaped twice: as text for plotly (&lt;, which plotly shows as <), then by json_script.
    assert "\\u0026lt;script\\u0026gt;" in html
    assert_inert(engineer_client.get(reverse("searches:search", args=[search.pk])).content.decode())


def test_the_problem_charts_show_per_shape_heatmaps(engineer_client, recorded):
    html = engineer_client.get(
        reverse("searches:problem_charts", args=["softmax"])
    ).content.decode()
    shown = figures(html)
    assert {"chart-heatmap-kinds", "chart-heatmap-kernels-h200", "chart-cross-gpu-softmax"} <= set(
        shown
    )
    heat = shown["chart-heatmap-kinds"]["data"][0]
    assert heat["x"] == ["h200"]
    assert "M=1,N=4096" in heat["y"]


def test_the_problem_charts_of_an_unknown_problem_are_404(engineer_client):
    assert engineer_client.get(reverse("searches:problem_charts", args=["nope"])).status_code == 404


def test_ten_thousand_trials_render_a_decimated_progress_chart(engineer_client, search):
    from tests.web.pages import bulk_trials

    bulk_trials(search, 10_000)
    url = reverse("searches:search_charts", args=[search.pk])
    body = engineer_client.get(url, {"format": "json"}).json()
    progress = body["charts"]["chart-progress"]
    meta = progress["layout"]["meta"]
    assert meta["trials"] == 10_000
    kept = Trial.objects.filter(search=search, status="kept").count()  # a third: 3,333
    assert meta["shown"] == kept  # every kept trial, nothing else fits in MAX_POINTS
    assert meta["decimated"] == 10_000 - kept
    assert len(json.dumps(body)) < 1_000_000
