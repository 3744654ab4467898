"""Charts in Chromium: plotly.js (served by the app) draws the server's figures as SVG, a judged
trial pushed over the websocket redraws the search's progress chart without a reload, and a
click on a roofline point opens its trial."""

from __future__ import annotations

import pytest

from searches import live
from tests.web import h200_trials
from tests.web.domain import accepted, judge, propose
from tests.web.test_live_browser import browser, cookie, open_page, orm, server  # noqa: F401

# Fixtures shared with the live-view browser test (daphne in a child process, Chromium).
FIXTURES = (browser, cookie, orm, server)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DRAWN = "document.querySelector('{0}') && document.querySelector('{0}').dataset.state === 'drawn'"


def plotted_indexes(page, chart: str) -> list[int]:
    """Trial indexes drawn as points (every trace but the incumbent line) in `chart`."""
    return page.evaluate(
        """(id) => {
          const plot = document.querySelector('#' + id + ' .chart-plot');
          const points = plot.data.filter(t => t.name !== 'incumbent');
          return points.flatMap(t => t.x).sort((a, b) => a - b);
        }""",
        chart,
    )


@pytest.fixture
def recorded_search(engineer):
    h200_trials.record_worker()
    return h200_trials.record_tuner_searches(engineer, ["softmax"])["softmax"]


def test_the_progress_chart_draws_and_updates_live_when_a_trial_lands(
    recorded_search,
    engineer,
    cookie,
    orm,
    server,
    browser,
):
    search = recorded_search
    page = open_page(browser, server, f"/searches/{search.pk}", cookie)
    page.wait_for_function(DRAWN.format("#chart-progress"), timeout=30_000)
    page.wait_for_function(DRAWN.format("#chart-burndown"), timeout=30_000)
    # plotly drew SVG: axes and one marker per judged trial.
    assert page.locator("#chart-progress svg.main-svg").count() >= 1
    assert page.locator("#chart-progress .point").count() >= 4
    before = plotted_indexes(page, "chart-progress")
    assert before == [1, 2, 3, 4]  # the seed and the tuner's three trials on the H200
    page.evaluate("window.notReloaded = true")
    revision = page.evaluate("document.querySelector('#chart-progress').dataset.revision")

    # A new, faster trial is judged and announced on the search's group, as the loop does.
    trial = orm(propose, search, 99)
    trial = orm(judge, trial, accepted(ms=0.001, noise=0.001))
    assert trial.status == "kept"
    orm(live.trial_changed, trial)
    page.wait_for_function(
        "document.querySelector('#chart-progress .chart-plot').data"
        ".some(t => t.name === 'kept' && t.x.includes(5))",
        timeout=30_000,
    )
    assert plotted_indexes(page, "chart-progress") == [1, 2, 3, 4, 5]
    incumbent = page.evaluate(
        "document.querySelector('#chart-progress .chart-plot').data"
        ".find(t => t.name === 'incumbent').x"
    )
    assert incumbent[-1] == 5
    assert page.evaluate("window.notReloaded") is True  # redrawn in place, no reload
    assert page.evaluate("document.querySelector('#chart-progress').dataset.revision") != revision
    assert page.locator(f"#trial-{trial.pk}").count() == 1  # the row arrived too


def test_the_gpus_page_draws_a_roofline_whose_points_open_their_trial(
    recorded_search,
    engineer,
    cookie,
    orm,
    server,
    browser,
):
    page = open_page(browser, server, "/gpus", cookie)
    page.wait_for_function(DRAWN.format("#chart-roofline-h200"), timeout=30_000)
    page.wait_for_function(DRAWN.format("#chart-speedup-h200"), timeout=30_000)
    assert page.locator("#chart-roofline-h200 svg.main-svg").count() >= 1
    assert page.locator("#chart-speedup-h200 .bars .point").count() >= 1
    # The cross-GPU chart has no data: its message shows, not an empty plot.
    assert page.is_visible("#chart-cross-gpu .chart-empty")
    assert not page.is_visible("#chart-cross-gpu .chart-plot")
    url = page.evaluate(
        "document.querySelector('#chart-roofline-h200 .chart-plot').data"
        ".find(t => t.name === 'softmax').customdata[0][0]"
    )
    assert url.startswith(f"/searches/{recorded_search.pk}/trials/")
    with page.expect_navigation():
        page.evaluate(
            """() => {
              const plot = document.querySelector('#chart-roofline-h200 .chart-plot');
              const trace = plot.data.find(t => t.name === 'softmax');
              plot.emit('plotly_click', {points: [{customdata: trace.customdata[0]}]});
            }"""
        )
    assert page.url.endswith(url)


def test_the_dashboard_without_data_shows_empty_states(engineer, cookie, server, browser):
    page = open_page(browser, server, "/", cookie)
    page.wait_for_selector("#charts-dashboard figure.chart", timeout=30_000)
    page.wait_for_function(
        "[...document.querySelectorAll('#charts-dashboard figure.chart')]"
        ".every(f => f.dataset.state === 'empty')",
        timeout=30_000,
    )
    assert page.is_visible("text=No GPU kind has timed results yet")
