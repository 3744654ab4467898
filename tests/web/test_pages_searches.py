"""The search page: status, budget, incumbent, controls and the paginated trial stream."""

from __future__ import annotations

import re

import pytest
from django.template.loader import render_to_string
from django.urls import reverse

from kernels.protocol import SEARCH_QUEUE
from kernels.queues import rq_queue
from searches import services
from searches.models import Search, StopReason, Trial
from tests.web.domain import idea_kwargs, propose, rejected
from tests.web.pages import (
    HOSTILE,
    HOSTILE_RAW,
    assert_inert,
    bulk_trials,
    h200_report,
    judged,
    knob_variant,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def page(client, search, **params):
    url = reverse("searches:search", args=[search.pk])
    return client.get(url, params)


def row_indexes(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="trial-\d+" [^>]*data-index="(\d+)"', html)]


def test_the_page_shows_status_budget_incumbent_and_trials(engineer_client, search):
    best = judged(search, knob_variant(2048), h200_report(), rationale="wider rows")
    failed = judged(search, knob_variant(4096), rejected("incorrect"), parent=best)
    html = page(engineer_client, search).content.decode()
    assert '<section id="search-status"' in html
    assert '<tbody id="trial-rows"' in html
    assert f'ws-connect="/ws/searches/{search.pk}/"' in html
    assert 'hx-ext="ws"' in html
    assert "Running" in html
    assert "2 / 50" in html  # trials used of the idea's 50
    incumbent = html[html.index('id="incumbent"') :]
    assert reverse("searches:trial", args=[search.pk, best.index]) in incumbent
    assert "0.97×" in incumbent and "1.34×" in incumbent  # the report's geomean speedups
    assert row_indexes(html) == [failed.index, best.index]
    assert 'badge badge-failed">Failed' in html
    assert "incorrect" in html
    assert "wider rows" in html
    assert 'id="interpret-note"' not in html
    assert "<dt>GPU minutes</dt>" in html and "CPU minutes" not in html


def test_a_trial_in_flight_shows_its_phase(engineer_client, search):
    trial = propose(search, 1)
    trial = services.mark_trial_queued(trial=trial, job_id="job-1")
    trial = services.mark_trial_phase(trial=trial, phase="verifying")
    html = page(engineer_client, search).content.decode()
    row = re.search(rf'<tr id="trial-{trial.pk}".*?</tr>', html, re.S).group(0)
    assert 'data-status="verifying"' in row
    assert 'class="pulse"' in row
    assert "Verifying" in row


def test_worker_progress_shows_in_the_row_the_consumer_pushes(search):
    trial = services.mark_trial_queued(trial=propose(search, 1), job_id="job-1")
    trial = services.mark_trial_phase(trial=trial, phase="verifying")
    row = render_to_string(
        "searches/partials/trial_row.html",
        {"trial": trial, "progress": {"phase": "verifying", "shape": 3, "of": 8}},
    )
    assert "Verifying 3/8" in row


def test_the_page_carries_the_targets_the_live_stream_swaps_into(engineer_client, search):
    html = page(engineer_client, search).content.decode()
    live = html[html.index('hx-ext="ws"') :]
    for target in ('id="live-error"', 'id="proposal-stream"', 'id="search-status"'):
        assert target in live
    assert '<tbody id="trial-rows" data-page="1">' in live


def test_an_interpret_search_says_timings_are_not_meaningful(engineer_client, engineer):
    idea = services.create_idea(**idea_kwargs(engineer, target_kinds=["interpret"]))
    search = services.start_search(idea=idea, user=engineer)
    html = page(engineer_client, search).content.decode()
    assert 'id="interpret-note"' in html
    assert "timings and speedups are not" in html
    budget = html[html.index('class="budget-bars"') : html.index("</dl>")]
    assert "<dt>CPU minutes</dt>" in budget and "GPU minutes" not in budget


def test_pause_resume_and_stop_change_the_status(
    engineer_client, search, redis_url, django_capture_on_commit_callbacks
):
    for action, status in (
        ("search_pause", Search.Status.PAUSED),
        ("search_resume", Search.Status.RUNNING),
        ("search_stop", Search.Status.FINISHED),  # nothing of it runs: it ends at once
    ):
        with django_capture_on_commit_callbacks(execute=True):
            response = engineer_client.post(reverse(f"searches:{action}", args=[search.pk]))
        assert response.status_code == 302
        assert response["Location"] == reverse("searches:search", args=[search.pk])
        search.refresh_from_db()
        assert search.status == status, action
    assert search.stop_reason == StopReason.USER
    # Resuming re-enqueued the loop.
    assert [tuple(job.args) for job in rq_queue(SEARCH_QUEUE, redis_url).jobs] == [(search.pk,)]


def test_get_on_a_control_changes_nothing(engineer_client, search):
    for action in ("search_pause", "search_stop"):
        response = engineer_client.get(reverse(f"searches:{action}", args=[search.pk]))
        assert response.status_code == 405
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING


def test_an_htmx_control_returns_the_status_partial(engineer_client, search):
    response = engineer_client.post(
        reverse("searches:search_pause", args=[search.pk]),
        headers={"HX-Request": "true", "HX-Target": "search-status"},
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.startswith('<section id="search-status"')
    assert "<html" not in html
    assert "Paused" in html
    assert reverse("searches:search_resume", args=[search.pk]) in html
    assert reverse("searches:search_pause", args=[search.pk]) not in html
    search.refresh_from_db()
    assert search.status == Search.Status.PAUSED


def test_a_control_the_lifecycle_refuses_says_why(engineer_client, search):
    response = engineer_client.post(
        reverse("searches:search_resume", args=[search.pk]), follow=True
    )
    assert "only a paused or ended one resumes" in response.content.decode()
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING
    response = engineer_client.post(
        reverse("searches:search_resume", args=[search.pk]), headers={"HX-Request": "true"}
    )
    assert "only a paused or ended one resumes" in response.content.decode()


def test_a_stopped_search_offers_no_controls(engineer_client, search, engineer):
    services.stop_search(search=search, user=engineer)
    html = page(engineer_client, search).content.decode()
    status = html[html.index('<section id="search-status"') : html.index('<section id="trials"')]
    assert "<button" not in status
    assert StopReason.USER in status


def test_ten_thousand_trials_page_two_shows_fifty_rows_in_bounded_queries(
    engineer_client, search, django_assert_max_num_queries
):
    bulk_trials(search, 10_000)
    with django_assert_max_num_queries(8):
        response = page(engineer_client, search, page=2)
    html = response.content.decode()
    assert row_indexes(html) == list(range(9950, 9900, -1))
    assert "page 2 of 200" in html
    assert 'href="?page=3"' in html and 'href="?page=1"' in html
    assert "big" * 1000 not in html  # reports are not loaded for the list


def test_htmx_paging_returns_only_the_trials_section(
    engineer_client, search, django_assert_max_num_queries
):
    bulk_trials(search, 120)
    with django_assert_max_num_queries(8):
        response = engineer_client.get(
            reverse("searches:search", args=[search.pk]),
            {"page": 3},
            headers={"HX-Request": "true", "HX-Target": "trials"},
        )
    html = response.content.decode()
    assert html.startswith('<section id="trials"')
    assert "<html" not in html
    assert row_indexes(html) == list(range(20, 0, -1))


def test_a_page_past_the_end_shows_the_last_page(engineer_client, search):
    bulk_trials(search, 60)
    html = page(engineer_client, search, page=99).content.decode()
    assert row_indexes(html) == list(range(10, 0, -1))
    assert page(engineer_client, search, page="x").status_code == 200


def test_the_partials_render_from_the_bare_context_a_consumer_has(search):
    trial = judged(search, knob_variant(2048), h200_report(), rationale=HOSTILE)
    row = render_to_string("searches/partials/trial_row.html", {"trial": trial})
    assert row.startswith(f'<tr id="trial-{trial.pk}"')
    assert "Kept" in row and "0.97×" in row
    for raw in HOSTILE_RAW:
        assert raw not in row
    fresh = Search.objects.get(pk=search.pk)
    status = render_to_string("searches/partials/search_status.html", {"search": fresh})
    assert status.startswith('<section id="search-status"')
    assert f"trial {trial.index}" in status


def test_hostile_rationale_is_inert_in_the_trial_stream(engineer_client, search):
    judged(search, knob_variant(2048), rejected("incorrect", HOSTILE), rationale=HOSTILE)
    html = page(engineer_client, search).content.decode()
    assert_inert(html)
    for raw in HOSTILE_RAW:
        assert raw not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_dashboard_lists_running_searches_and_recent_wins(engineer_client, search):
    win = judged(search, knob_variant(2048), h200_report())
    assert win.status == Trial.Status.KEPT
    html = engineer_client.get(reverse("searches:dashboard")).content.decode()
    running = html[html.index('id="running-searches"') : html.index('id="recent-wins"')]
    assert reverse("searches:search", args=[search.pk]) in running
    wins = html[html.index('id="recent-wins"') : html.index('id="fleet"')]
    assert reverse("searches:trial", args=[search.pk, win.index]) in wins
    assert "0.97× eager" in wins and "1.34× compiled" in wins


def test_the_page_shows_the_strategy_the_skipped_variants_and_the_per_shape_table(
    engineer_client, search
):
    best = judged(search, knob_variant(2048), h200_report())
    services.set_strategy(search=search, strategy="exhaustive: the budget (50) covers all 20")
    services.skip_variant(
        search=search,
        values={"BLOCK_N": 4096},
        reason="Search 1 already tried this exact source as trial 1.",
    )
    timed = {
        "labels": ["M=1,N=4096", "M=4096,N=4096"],
        "shapes": [{"M": 1, "N": 4096}, {"M": 4096, "N": 4096}],
        "kernels": [[{"median": 0.004, "spread": 0.01, "passed": True}] * 2],
        "baselines": [
            {
                "eager": {"median": 0.01, "spread": 0.01},
                "compiled": {"median": 0.0035, "spread": 0.01},
            },
            {
                "eager": {"median": 0.02, "spread": 0.01},
                "compiled": {"median": 0.010, "spread": 0.01},
            },
        ],
        "verdict": "accepted",
        "reasons": [],
    }
    services.record_table(search=search, timed=timed, kernels=[best.index])

    html = page(engineer_client, search).content.decode()

    engine = html[html.index('id="engine"') :]
    assert "exhaustive: the budget (50) covers all 20" in engine
    assert "Skipped variants" in engine and "BLOCK_N=4096" in engine
    assert "already tried this exact source as trial 1" in engine
    table = engine[engine.index('id="dispatch-table"') :]
    rows = re.findall(r'<tr class="serve-(\w+)">', table)
    assert rows == ["compiled", "kernel"]  # trial 1 loses to torch.compile on M=1 only
    assert reverse("searches:trial", args=[search.pk, best.index]) in table
    assert "1 of 2 shapes served by generated kernels" in engine


def test_a_confirming_trial_says_against_which_incumbent(engineer_client, search):
    first = judged(search, knob_variant(2048), h200_report())
    trial = services.record_proposal(
        search=search, source=knob_variant(4096), parent=first, proposer="tuner"
    )
    report = h200_report(geomean_ms=first.geomean_ms / 2, noise=0.01)
    trial = services.record_result(trial=trial, report=report, gpu_seconds=1.0)
    assert trial.status == Trial.Status.CONFIRMING

    html = page(engineer_client, search).content.decode()
    detail = engineer_client.get(reverse("searches:trial", args=[search.pk, trial.index]))

    assert 'badge badge-confirming"><span class="pulse"' in html
    body = detail.content.decode()
    confirmation = body[body.index('id="confirmation"') :]
    assert "being re-timed" in confirmation
    assert reverse("searches:trial", args=[search.pk, first.index]) in confirmation
