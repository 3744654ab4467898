from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.utils import timezone

from searches import selectors, services
from searches.models import FAILURES, Search, Trial
from tests.web.domain import accepted, idea_kwargs, interpreted, judge, propose, rejected, variant

pytestmark = pytest.mark.django_db

MANY = 10_000


def _bulk_trials(search: Search, n: int) -> None:
    now = timezone.now()
    Trial.objects.bulk_create(
        (
            Trial(
                search=search,
                index=i,
                source=f"# candidate {i}\n" + "x = 1\n" * 200,
                source_sha256=f"{i:064x}",
                proposer="tuner",
                status=Trial.Status.REVERTED,
                report={"verdict": "accepted", "shapes": [{"ms": 0.1}] * 20},
                finished_at=now,
            )
            for i in range(1, n + 1)
        ),
        batch_size=2000,
    )
    Search.objects.filter(pk=search.pk).update(trials_total=n)


def test_a_page_of_10000_trials_takes_two_queries_and_50_rows(
    search, django_assert_max_num_queries
):
    _bulk_trials(search, MANY)
    with django_assert_max_num_queries(2):
        page = selectors.trials_page(search, page=1)
        indexes = [t.index for t in page.trials]
        statuses = {t.status for t in page.trials}
    assert indexes == list(range(MANY, MANY - 50, -1))
    assert statuses == {"reverted"}
    assert (page.total, page.num_pages, page.has_next, page.has_previous) == (
        MANY,
        200,
        True,
        False,
    )
    assert {"source", "report", "prompt"} <= page.trials[0].get_deferred_fields()


def test_the_last_page_and_out_of_range_pages_are_bounded(search, django_assert_max_num_queries):
    _bulk_trials(search, MANY)
    with django_assert_max_num_queries(2):
        last = selectors.trials_page(search, page=200)
    assert [t.index for t in last.trials] == list(range(50, 0, -1))
    assert not last.has_next and last.has_previous
    with django_assert_max_num_queries(2):
        beyond = selectors.trials_page(search, page=10**6, per_page=10**6)
    assert beyond.per_page == selectors.MAX_PER_PAGE and len(beyond.trials) == 200
    assert beyond.page == MANY // selectors.MAX_PER_PAGE
    assert selectors.trials_page(search, page="junk").page == 1


def test_an_empty_search_has_one_empty_page(search):
    page = selectors.trials_page(search)
    assert (page.trials, page.total, page.num_pages, page.has_next) == ([], 0, 1, False)


def test_only_unfinished_searches_are_running(idea, engineer, search):
    finished = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    services.finish_search(search=finished, reason="done")
    queued = services.start_search(idea=idea, user=engineer)
    running = selectors.running_searches()
    assert [s.pk for s in running] == [queued.pk, search.pk]


def test_recent_wins_are_kept_trials_newest_first(search, django_assert_max_num_queries):
    first = judge(propose(search, 1), accepted(ms=0.5))
    judge(propose(search, 2), rejected())
    judge(propose(search, 3), accepted(ms=0.6))
    second = judge(propose(search, 4), accepted(ms=0.3))
    with django_assert_max_num_queries(1):
        wins = selectors.recent_wins(limit=5)
        problems = [w.search.idea.problem for w in wins]
    assert [w.pk for w in wins] == [second.pk, first.pk]
    assert problems == ["softmax", "softmax"]


def test_recent_wins_leave_out_untimed_and_slower_kept_trials(search, engineer):
    # The first correct candidate is kept as the incumbent even when it loses to both
    # baselines; a search on the CPU interpreter keeps an untimed one. Neither is a win.
    slower = judge(propose(search, 1), accepted(ms=0.9))  # 0.67x eager, 0.61x compiled
    assert slower.status == Trial.Status.KEPT
    idea = services.create_idea(**idea_kwargs(engineer, target_kinds=["interpret"]))
    cpu = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    untimed = judge(propose(cpu, 1), interpreted())
    assert untimed.status == Trial.Status.KEPT
    assert selectors.recent_wins() == []
    faster = judge(propose(search, 2), accepted(ms=0.5))  # 1.2x eager
    assert [w.pk for w in selectors.recent_wins()] == [faster.pk]


def test_an_engineer_gets_a_search_by_id(search, engineer, reviewer):
    assert selectors.search_for_user(engineer, search.pk).pk == search.pk
    assert selectors._get_search_for_user(reviewer, str(search.pk)).pk == search.pk


@pytest.mark.parametrize("who", ["outsider", "anonymous"])
def test_a_user_without_a_role_is_denied(search, outsider, who):
    user = outsider if who == "outsider" else AnonymousUser()
    with pytest.raises(PermissionDenied):
        selectors.search_for_user(user, search.pk)


@pytest.mark.parametrize("search_id", [999_999, "abc", None])
def test_a_missing_search_is_404(search, engineer, search_id):
    with pytest.raises(Http404):
        selectors.search_for_user(engineer, search_id)


def test_a_trial_is_found_by_its_index_in_the_search(search, engineer):
    trial = propose(search, 1)
    assert selectors.trial_for_user(engineer, search.pk, 1).pk == trial.pk
    with pytest.raises(Http404):
        selectors.trial_for_user(engineer, search.pk, 2)


def test_success_rates_are_grouped_by_model(search, engineer):
    judge(propose(search, 1), accepted(ms=0.5))
    judge(propose(search, 2), rejected())
    judge(propose(search, 3, proposer="llm:gpt-4o", model="gpt-4o"), accepted(ms=0.25))
    judge(propose(search, 4, proposer="llm:gpt-4o", model="gpt-4o"), rejected("timeout"))
    judge(propose(search, 5, proposer="llm:gpt-4o", model="gpt-4o"), rejected("crashed"))
    propose(search, 6, proposer="llm:qwen", model="qwen")  # in flight: counted, not judged
    rows = {r["model"]: r for r in selectors.model_success_rates(search)}
    assert rows["gpt-4o"]["total"] == 3 and rows["gpt-4o"]["judged"] == 3
    assert (rows["gpt-4o"]["kept"], rows["gpt-4o"]["failed"]) == (1, 2)
    assert rows["gpt-4o"]["success_rate"] == pytest.approx(1 / 3)
    assert rows["gpt-4o"]["best_speedup_eager"] == pytest.approx(2.4)
    assert (rows[None]["proposer"], rows[None]["kept"], rows[None]["failed"]) == ("tuner", 1, 1)
    assert rows[None]["success_rate"] == 0.5
    assert (rows["qwen"]["total"], rows["qwen"]["judged"], rows["qwen"]["success_rate"]) == (
        1,
        0,
        None,
    )


def test_success_rates_span_every_search_when_none_is_given(search, idea, engineer):
    other = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    judge(propose(search, 1), accepted())
    judge(propose(other, 1), accepted())
    (row,) = selectors.model_success_rates()
    assert (row["total"], row["kept"]) == (2, 2)


def test_the_failure_taxonomy_counts_each_category(search):
    judge(propose(search, 1), rejected("incorrect"))
    judge(propose(search, 2), rejected("incorrect"))
    judge(propose(search, 3), rejected("timeout"))
    judge(propose(search, 4), accepted())
    taxonomy = selectors.failure_taxonomy(search)
    assert list(taxonomy) == list(FAILURES)
    assert taxonomy["incorrect"] == 2 and taxonomy["timeout"] == 1
    assert sum(taxonomy.values()) == 3


def test_in_flight_trials_and_history_rebuild_the_loop(search):
    done = judge(propose(search, 1), interpreted())
    queued = services.mark_trial_queued(
        trial=propose(search, 2, knob_values={"BLOCK_N": 512}), job_id="j2"
    )
    proposed = propose(search, 3)
    assert [t.pk for t in selectors.in_flight_trials(search)] == [queued.pk, proposed.pk]
    history = selectors.trial_history(search)
    assert [(h["index"], h["status"]) for h in history] == [
        (done.index, "kept"),
        (2, "queued"),
        (3, "proposed"),
    ]
    assert history[1]["knob_values"] == {"BLOCK_N": 512}
    assert selectors.source_seen(search, variant(3))
    assert not selectors.source_seen(search, variant(4))


def test_a_reconnecting_stream_gets_trials_changed_since(search):
    first = propose(search, 1)
    mark = Trial.objects.get(pk=first.pk).updated_at
    second = propose(search, 2)
    Trial.objects.filter(pk=second.pk).update(updated_at=mark + timedelta(seconds=1))
    assert [t.pk for t in selectors.trials_updated_since(search, mark)] == [second.pk]
    services.mark_trial_phase(trial=first, phase="compiling")
    changed = selectors.trials_updated_since(search, mark)
    assert {t.pk for t in changed} == {first.pk, second.pk}


def test_idea_listing_still_reads_the_problem_registry(engineer):
    services.create_idea(**idea_kwargs(engineer))
    assert "softmax" in [p["name"] for p in selectors.list_problems().problems]
