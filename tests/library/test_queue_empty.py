"""An empty review queue says why, with counts; a trial's page links to its review status."""

from __future__ import annotations

import pytest
from django.urls import reverse

from library import selectors, services
from searches import services as search_services
from searches.models import Trial
from tests.library.helpers import candidate
from tests.web.domain import interpreted, variant

pytestmark = pytest.mark.django_db


@pytest.fixture
def engineer_client(client, engineer):
    client.force_login(engineer)
    return client


def another(search, engineer, seed):
    return search_services.begin_search(
        search=search_services.start_search(idea=search.idea, user=engineer, seed=seed)
    )


def empty_lines(client, query=""):
    page = client.get(reverse("library:queue") + query)
    assert page.context["queue"].trials == []
    assert 'id="queue-empty"' in page.content.decode()
    return page.context["why_empty"]


def test_with_no_trials_the_queue_says_to_search_or_import(engineer_client):
    (line,) = empty_lines(engineer_client)
    assert "No trials yet" in line and "manage.py import_reports" in line


def test_the_empty_queue_counts_each_reason(engineer_client, search, engineer, reviewer):
    # Search 1: its best trial ran on the interpreter (never timed).
    trial = search_services.record_proposal(
        search=search, source=variant(99), parent=None, proposer="tuner"
    )
    search_services.record_result(trial=trial, report=interpreted(), gpu_seconds=0)
    # Searches 2 and 3: timed incumbents that beat no baseline beyond noise.
    for seed in (2, 3):
        candidate(another(search, engineer, seed), eager=0.5 * 1.005)
    # Search 4: a candidate already vetoed, with a slower trial reverted after it.
    decided = candidate(another(search, engineer, 4), ms=0.5)
    candidate(decided.search, ms=0.52, parent=decided)
    services.decide(trial=decided, user=reviewer, action="veto", text="fp16 accumulation")

    lines = empty_lines(engineer_client)
    text = "\n".join(lines)
    assert "1 search has its best trial from the CPU interpreter, which is never timed" in text
    assert "2 kept trials lack a baseline win" in text
    assert "1 candidate was already decided" in text
    assert "1 trial was not kept" in text
    html = engineer_client.get(reverse("library:queue")).content.decode()
    assert "2 kept trials lack a baseline win" in html


def test_filters_that_hide_every_candidate_are_named(engineer_client, search):
    candidate(search)
    (line,) = empty_lines(engineer_client, "?kind=a100")
    assert line == "1 candidate waits, but none matches these filters."


def test_a_full_queue_gives_no_reasons(search):
    candidate(search)
    assert selectors.why_queue_is_empty(selectors.review_queue()) == []


def test_the_trial_page_says_where_the_trial_stands_with_review(engineer_client, search, reviewer):
    first = candidate(search, ms=0.5)
    slower = candidate(search, ms=0.52, parent=first)
    assert slower.status == Trial.Status.REVERTED

    def status(trial):
        html = engineer_client.get(
            reverse("searches:trial", args=[search.pk, trial.index])
        ).content.decode()
        start = html.index('id="review-status"')
        return html[start : html.index("</p>", start)]

    review_link = reverse("library:review", args=[first.pk])
    assert 'data-state="queued"' in status(first) and review_link in status(first)
    out = status(slower)
    assert 'data-state="out"' in out and "the trial is reverted, not kept" in out
    services.decide(trial=first, user=reviewer, action="veto", text="fp16 accumulation")
    decided = status(first)
    assert 'data-state="decided"' in decided and "vetoed" in decided.lower()
    assert "grace" in decided and review_link in decided
