"""The search page's trial table as Optuna Dashboard users expect it: filter by status, speedup
and knob value, sort by time, speedups or a knob (a query string the pager keeps), and compare
any two trials side by side."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from searches.models import Trial
from tests.web.domain import accepted, judge, propose, rejected
from tests.web.pages import assert_inert, bulk_trials, h200_report, judged, knob_variant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def indexes(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="trial-\d+" [^>]*data-index="(\d+)"', html)]


def table(client, search, **params) -> str:
    response = client.get(reverse("searches:search", args=[search.pk]), params)
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def sweep(search):
    """Five trials: BLOCK_N 256..4096 (NUM_WARPS 4), judged with different speedups."""
    trials = {}
    for i, (block, ms) in enumerate([(256, 0.9), (512, 0.5), (2048, 0.3), (4096, None)], 1):
        report = accepted(ms=ms) if ms else rejected("incorrect")
        trial = propose(search, i, knob_values={"BLOCK_N": block, "NUM_WARPS": 4})
        trials[block] = judge(trial, report)
    trials["queued"] = propose(search, 5, knob_values={"BLOCK_N": 8192, "NUM_WARPS": 8})
    return trials


def test_the_table_filters_by_status_speedup_and_knob_value(engineer_client, search, sweep):
    assert indexes(table(engineer_client, search)) == [5, 4, 3, 2, 1]
    assert indexes(table(engineer_client, search, status="failed")) == [4]
    assert indexes(table(engineer_client, search, status="in_flight")) == [5]
    # 0.6 / ms vs eager: 0.67x, 1.2x, 2x
    assert indexes(table(engineer_client, search, min_speedup="1.1")) == [3, 2]
    assert indexes(table(engineer_client, search, **{"knob.BLOCK_N": "512"})) == [2]
    assert indexes(table(engineer_client, search, **{"knob.NUM_WARPS": "8"})) == [5]
    both = table(engineer_client, search, **{"knob.NUM_WARPS": "4", "min_speedup": "1.5"})
    assert indexes(both) == [3]
    assert 'data-page="filtered"' in both  # the live stream inserts no new trial into it
    assert "1 shown" in both and "5 in all" in both


def test_the_table_sorts_by_speedup_time_and_knob_with_untimed_trials_last(
    engineer_client, search, sweep
):
    assert indexes(table(engineer_client, search, sort="eager")) == [3, 2, 1, 5, 4]
    assert indexes(table(engineer_client, search, sort="fastest")) == [3, 2, 1, 5, 4]
    assert indexes(table(engineer_client, search, sort="oldest")) == [1, 2, 3, 4, 5]
    # Knob values sort as numbers (256 < 2048), not as text.
    assert indexes(table(engineer_client, search, sort="knob:BLOCK_N")) == [1, 2, 3, 4, 5]
    assert indexes(table(engineer_client, search, sort="-knob:BLOCK_N")) == [5, 4, 3, 2, 1]


def test_the_filter_form_offers_each_knobs_choices(engineer_client, search):
    html = table(engineer_client, search)
    start = html.index('id="trial-filters"')
    form = html[start : html.index("</form>", start)]
    assert '<select name="knob.BLOCK_N"' in form
    for value in ("256", "512", "1024", "2048", "4096", "8192"):
        assert f'<option value="{value}">{value}</option>' in form
    assert '<option value="-knob:NUM_WARPS">NUM_WARPS descending</option>' in form


def test_the_pager_keeps_the_filters(engineer_client, search):
    bulk_trials(search, 60)
    Trial.objects.filter(search=search, index__lte=55).update(knob_values={"BLOCK_N": 512})
    html = table(engineer_client, search, **{"knob.BLOCK_N": "512", "sort": "oldest"})
    assert indexes(html)[:3] == [1, 2, 3] and len(indexes(html)) == 50
    nav = html[html.index('aria-label="trial pages"') :]
    nxt = re.search(r'<a href="\?([^"]*)" [^>]*rel="next"', nav).group(1).split("&amp;")
    assert sorted(nxt) == ["knob.BLOCK_N=512", "page=2", "sort=oldest"]
    page2 = table(engineer_client, search, **{"knob.BLOCK_N": "512", "sort": "oldest", "page": 2})
    assert indexes(page2) == [51, 52, 53, 54, 55]


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"min_speedup": "fast"}, "min_speedup", "Enter a number"),
        ({"min_speedup": "-1"}, "min_speedup", "greater than or equal to 0"),
        ({"status": "exploded"}, "status", "Select a valid choice"),
        ({"knob.BLOCK_N": "333"}, "knob.BLOCK_N", "Select a valid choice"),
        ({"sort": "knob:__class__"}, "sort", "Select a valid choice"),
    ],
)
def test_a_bad_filter_says_so_and_shows_every_trial(
    engineer_client, search, sweep, params, field, message
):
    html = table(engineer_client, search, **params)
    assert indexes(html) == [5, 4, 3, 2, 1]
    block = html[html.index(f'name="{field}"') :]
    assert message in block[: block.index("</div>")]


def test_an_htmx_filter_returns_the_trials_section(engineer_client, search, sweep):
    response = engineer_client.get(
        reverse("searches:search", args=[search.pk]),
        {"status": "kept"},
        headers={"HX-Request": "true", "HX-Target": "trials"},
    )
    html = response.content.decode()
    assert html.startswith('<section id="trials"')
    kept = Trial.objects.filter(status="kept").order_by("-index")
    assert indexes(html) == [t.index for t in kept]


def compare(client, search, a, b):
    return client.get(reverse("searches:compare", args=[search.pk]), {"a": a, "b": b})


def test_two_trials_compare_side_by_side(engineer_client, search):
    first = judged(search, knob_variant(2048), h200_report(), rationale="wider rows <b>x</b>")
    second = judged(search, knob_variant(4096), h200_report(geomean_ms=0.05), parent=first)
    response = compare(engineer_client, search, first.index, second.index)
    assert response.status_code == 200
    html = response.content.decode()
    assert_inert(html)
    sides = html[html.index('id="compare-sides"') : html.index('id="compare-shapes"')]
    for trial in (first, second):
        assert reverse("searches:trial", args=[search.pk, trial.index]) in sides
    assert "wider rows &lt;b&gt;x&lt;/b&gt;" in sides
    diff = html[html.index('id="compare-diff"') :]
    assert 'class="diff-replace"' in diff
    assert "2048" in diff and "4096" in diff
    shapes = html[html.index('id="compare-shapes"') : html.index('id="compare-diff"')]
    labels = [s["label"] for s in h200_report()["shapes"]]
    assert all(label in shapes for label in labels)
    first_ms = f"{h200_report()['shapes'][0]['candidate_ms']:.4f}"[:5]
    assert first_ms in shapes  # both trials' numbers, per shape


def test_compare_refuses_bad_numbers_clearly(engineer_client, search):
    trial = judged(search, knob_variant(2048), h200_report())
    response = compare(engineer_client, search, "x", trial.index)
    assert response.status_code == 400
    assert "Give two trial numbers" in response.content.decode()
    assert compare(engineer_client, search, trial.index, 99).status_code == 404


def test_compare_is_for_engineers(outsider_client, search):
    trial = judged(search, knob_variant(2048), h200_report())
    assert compare(outsider_client, search, trial.index, trial.index).status_code == 403


def test_the_search_page_offers_to_compare_the_incumbent_with_the_newest(engineer_client, search):
    best = judged(search, knob_variant(2048), h200_report())
    judged(search, knob_variant(4096), rejected("incorrect"), parent=best)
    html = table(engineer_client, search)
    form = html[html.index('id="compare-form"') :]
    assert f'action="{reverse("searches:compare", args=[search.pk])}"' in form
    assert f'name="a" min="1" required value="{best.index}"' in form
    assert 'name="b" min="1" required value="2"' in form
