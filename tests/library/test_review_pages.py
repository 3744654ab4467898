"""The review page, the actions on it, and their permissions, CSRF and idempotency."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from kernels.queues import rq_queue
from library import selectors
from library.models import Release, Revalidation, Review
from searches.models import Idea, Trial
from searches.selectors import table_rows_of
from tests.library.helpers import SHAPES, candidate
from tests.web.domain import SOFTMAX_SEED
from tests.web.pages import HOSTILE, HOSTILE_RAW, assert_inert, knob_variant

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer_client(client, reviewer):
    client.force_login(reviewer)
    return client


@pytest.fixture
def pair(search):
    """A parent (the seed as is) and a child changing one knob: the candidate under review."""
    parent = candidate(search, SOFTMAX_SEED, ms=0.5)
    child = candidate(
        search,
        knob_variant(4096),
        parent=parent,
        ms=0.3,
        rationale="BLOCK_N=4096 keeps a 4096 row in one block",
    )
    assert child.status == Trial.Status.KEPT
    return parent, child


def decide_url(trial):
    return reverse("library:decide", args=[trial.pk])


def approve_data(key="k1", **extra):
    data = {
        "action": "approve",
        "request_key": key,
        "range_M_lo": "1",
        "range_M_hi": "4096",
        "range_N_lo": "1000",
        "range_N_hi": "32768",
        "text": "looks right",
    }
    data.update(extra)
    return data


# -- the page ---------------------------------------------------------------------------------


def test_the_review_page_shows_diffs_table_checks_device_lineage_and_prompt(reviewer_client, pair):
    parent, child = pair
    html = reviewer_client.get(reverse("library:review", args=[child.pk])).content.decode()
    for section in ("diff-parent", "diff-seed", "shapes", "checks", "lineage", "prompt"):
        assert f'id="{section}"' in html, section
    # Side by side: the changed knob line appears as a replace row, old value and new value.
    assert 'class="diff-replace"' in html
    assert "1024" in html and "4096" in html
    assert "trial 1" in html and "trial 2" in html  # lineage and diff headers
    for row in SHAPES:
        assert row["label"] in html
    assert "cuda_graph" in html and "captured and replayed" in html
    assert "NVIDIA H200" in html and "triton 3.6.0" in html
    # The reviewer sees what isolation the candidate ran under, and what it lacked.
    assert '<span class="chip" title="applied">write confinement (Landlock ABI 7)</span>' in html
    assert "without socket filter (seccomp)" in html
    assert "Make softmax faster." in html
    assert "BLOCK_N=4096 keeps a 4096 row in one block" in html
    # Default range: the span of the measured shapes.
    assert 'name="range_N_hi" value="32768"' in html


def test_the_review_page_shows_the_searchs_per_shape_table(reviewer_client, pair):
    from searches import services as search_services

    _, child = pair
    url = reverse("library:review", args=[child.pk])
    assert 'id="search-table"' not in reviewer_client.get(url).content.decode()  # none yet
    timed = {
        "labels": ["M=1,N=4096", "M=4096,N=1000"],
        "shapes": [{"M": 1, "N": 4096}, {"M": 4096, "N": 1000}],
        "kernels": [[{"median": 0.004, "spread": 0.01, "passed": True}] * 2],
        "baselines": [
            {
                "eager": {"median": 0.01, "spread": 0.01},
                "compiled": {"median": 0.0035, "spread": 0.01},
            },
            {
                "eager": {"median": 0.02, "spread": 0.01},
                "compiled": {"median": 0.01, "spread": 0.01},
            },
        ],
        "verdict": "accepted",
        "reasons": [],
    }
    search_services.record_table(search=child.search, timed=timed, kernels=[child.index])
    html = reviewer_client.get(url).content.decode()
    section = html[html.index('id="search-table"') :]
    section = section[: section.index("</section>")]
    assert re.findall(r'<tr class="serve-(\w+)">', section) == ["compiled", "kernel"]
    assert "1 of 2 shapes served by generated kernels" in section
    # Per shape: the serving time, both baselines' times, and the trial that serves it.
    first = section[section.index('<tr class="serve-compiled">') :]
    first = first[: first.index("</tr>")]
    assert "torch.compile" in first
    assert [c for c in re.findall(r'<td class="num">([^<]*)</td>', first)][:3] == [
        "0.0035 ms",
        "0.01 ms",
        "0.0035 ms",
    ]
    assert reverse("searches:trial", args=[child.search_id, child.index]) in section
    child.search.refresh_from_db()
    rows = table_rows_of(child.search)
    assert [(r["serve"], r["trial"]) for r in rows] == [("compiled", None), ("kernel", child.index)]


def test_the_queue_and_the_page_link_each_other(engineer_client, pair):
    _, child = pair
    html = engineer_client.get(reverse("library:queue")).content.decode()
    assert reverse("library:review", args=[child.pk]) in html
    assert 'id="reviewer-counts"' in html


def test_an_engineer_sees_the_page_without_the_forms(engineer_client, pair):
    html = engineer_client.get(reverse("library:review", args=[pair[1].pk])).content.decode()
    assert 'id="approve-form"' not in html
    assert "Only reviewers" in html


def test_an_outsider_cannot_see_reviews_or_releases(outsider_client, pair):
    for url in (
        reverse("library:queue"),
        reverse("library:review", args=[pair[1].pk]),
        reverse("library:releases"),
        reverse("library:download"),
    ):
        assert outsider_client.get(url).status_code == 403, url


def test_hostile_llm_text_is_rendered_inert(reviewer_client, reviewer, search):
    source = SOFTMAX_SEED + f"\n# {HOSTILE}\nNOTE = '''{HOSTILE}'''\n"
    trial = candidate(search, source, rationale=HOSTILE, prompt=HOSTILE)
    for url in (reverse("library:review", args=[trial.pk]), reverse("library:queue")):
        html = reviewer_client.get(url).content.decode()
        assert_inert(html)
        for raw in HOSTILE_RAW[:2]:  # the third is harmless as text (pygments leaves quotes)
            assert raw not in html
    assert (
        "&lt;script&gt;"
        in reviewer_client.get(reverse("library:review", args=[trial.pk])).content.decode()
    )
    # A reviewer's own text (a veto reason) is shown inert too.
    reviewer_client.post(decide_url(trial), {"action": "veto", "text": HOSTILE, "request_key": "v"})
    html = reviewer_client.get(reverse("library:review", args=[trial.pk])).content.decode()
    assert_inert(html)
    assert HOSTILE_RAW[0] not in html


# -- permissions, CSRF, GET --------------------------------------------------------------------


def test_an_engineer_cannot_approve_veto_or_send_back(engineer_client, pair):
    _, child = pair
    for data in (
        approve_data(),
        {"action": "veto", "text": "no"},
        {"action": "send_back", "text": "x"},
    ):
        assert engineer_client.post(decide_url(child), data).status_code == 403
    assert not Review.objects.exists()


def test_get_never_decides(reviewer_client, pair):
    _, child = pair
    response = reviewer_client.get(decide_url(child), approve_data())
    assert response.status_code == 405
    assert not Review.objects.exists()


def test_a_post_without_the_csrf_token_is_refused(reviewer, pair):
    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    assert client.post(decide_url(pair[1]), approve_data()).status_code == 403
    assert not Review.objects.exists()
    # With the page's token it goes through.
    page = client.get(reverse("library:review", args=[pair[1].pk]))
    token = page.cookies["csrftoken"].value
    response = client.post(decide_url(pair[1]), {**approve_data(), "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Review.objects.count() == 1


# -- actions ----------------------------------------------------------------------------------


def test_approving_records_the_range_and_queues_revalidation_on_every_target_kind(
    reviewer_client, pair, redis_url, django_capture_on_commit_callbacks
):
    _, child = pair
    Idea.objects.filter(pk=child.search.idea_id).update(target_kinds=["h200", "b200"])
    with django_capture_on_commit_callbacks(execute=True):
        response = reviewer_client.post(decide_url(child), approve_data())
    assert response.status_code == 302
    review = Review.objects.get()
    assert review.action == "approve" and review.text == "looks right"
    assert review.shape_range == {"M": [1, 4096], "N": [1000, 32768]}
    revals = {r.kind: r for r in review.revalidations.all()}
    assert set(revals) == {"h200", "b200"}
    for kind, reval in revals.items():
        jobs = rq_queue(f"gpu.{kind}", redis_url).jobs
        assert [j.id for j in jobs] == [reval.job_id]
        assert jobs[0].func_name == "kernels.worker.revalidate_job"
        assert jobs[0].kwargs["shape_range"] == review.shape_range
        assert jobs[0].kwargs["source"] == child.source
    watchers = rq_queue("search", redis_url).jobs
    assert [j.func_name for j in watchers] == ["library.tasks.watch_review"]
    assert not Release.objects.exists()  # only after re-validation passes


def test_a_double_submitted_approval_has_one_effect(
    reviewer_client, pair, redis_url, django_capture_on_commit_callbacks
):
    _, child = pair
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            response = reviewer_client.post(decide_url(child), approve_data(key="same"))
        assert response.status_code == 302
    assert Review.objects.count() == 1
    assert Revalidation.objects.count() == 1
    assert len(rq_queue("gpu.h200", redis_url).jobs) == 1
    # A second form (another tab) cannot decide again either.
    response = reviewer_client.post(
        decide_url(child), {"action": "veto", "text": "no", "request_key": "other"}, follow=True
    )
    assert "already approved" in response.content.decode()
    assert Review.objects.get().action == "approve"


def test_a_bad_range_is_a_form_error_and_saves_nothing(reviewer_client, pair):
    _, child = pair
    response = reviewer_client.post(
        decide_url(child), approve_data(range_N_lo="40000"), follow=True
    )
    assert "need 1 &lt;= from &lt;= to" in response.content.decode()
    assert not Review.objects.exists()


def test_a_veto_needs_a_reason(reviewer_client, pair):
    response = reviewer_client.post(
        decide_url(pair[1]), {"action": "veto", "text": "  "}, follow=True
    )
    assert "Say why you veto" in response.content.decode()
    assert not Review.objects.exists()


def test_a_veto_with_prohibit_reaches_the_agent_context_and_the_prohibitions(reviewer_client, pair):
    _, child = pair
    reason = "Reads x twice; fuse the passes instead of raising BLOCK_N"
    reviewer_client.post(
        decide_url(child), {"action": "veto", "text": reason, "prohibit": "on", "request_key": "v"}
    )
    search = child.search
    notes = selectors.review_notes_for_search(search)
    assert [(n["action"], n["trial"], n["text"], n["prohibit"]) for n in notes] == [
        ("veto", child.index, reason, True)
    ]
    assert reason in selectors.review_notes_text(search)
    idea = Idea.objects.get(pk=search.idea_id)
    assert reason in idea.prohibition_list
    assert "no torch.softmax" in idea.prohibition_list  # the engineer's own stay


def test_a_send_back_note_reaches_the_agent_without_prohibiting(reviewer_client, pair):
    _, child = pair
    reviewer_client.post(
        decide_url(child), {"action": "send_back", "text": "try num_warps 8", "request_key": "s"}
    )
    assert selectors.review_notes_for_search(child.search)[0]["text"] == "try num_warps 8"
    assert "try num_warps 8" not in Idea.objects.get(pk=child.search.idea_id).prohibitions


def test_a_trial_outside_the_queue_cannot_be_decided(reviewer_client, pair):
    parent, _ = pair  # superseded by the child
    response = reviewer_client.post(decide_url(parent), approve_data(), follow=True)
    assert "not in the review queue" in response.content.decode()
    assert not Review.objects.exists()


def test_a_veto_reason_reaches_the_agents_next_prompt(reviewer_client, pair):
    """The reason lands in the prompt's notes."""
    pytest.importorskip("searches.agent.notes")
    from searches.agent.context import gather

    _, child = pair
    reason = "The row loop re-reads x from DRAM; keep the row in registers"
    reviewer_client.post(decide_url(child), {"action": "veto", "text": reason, "request_key": "v"})
    notes = gather(child.search, "h200").notes
    assert ("veto", f"trial {child.index}: {reason}") in notes


def test_the_queue_filter_swaps_in_only_the_table_for_htmx(engineer_client, pair):
    response = engineer_client.get(
        reverse("library:queue"),
        {"problem": "softmax", "sort": "-age"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="queue-table",
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<section class="card spaced" id="queue-table">')
    assert "<html" not in html
    assert reverse("library:review", args=[pair[1].pk]) in html
