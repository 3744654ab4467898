from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.utils import timezone

from core.errors import DomainError, IllegalTransition
from searches import services
from searches.models import Search, StopReason
from tests.web.domain import idea_kwargs

pytestmark = pytest.mark.django_db

S = Search.Status
LEGAL = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.STOPPING),
    (S.QUEUED, S.FAILED),
    (S.RUNNING, S.PAUSED),
    (S.RUNNING, S.STOPPING),
    (S.RUNNING, S.FAILED),
    (S.PAUSED, S.RUNNING),
    (S.PAUSED, S.STOPPING),
    (S.PAUSED, S.FAILED),
    (S.STOPPING, S.FINISHED),
    (S.STOPPING, S.FAILED),
    (S.FINISHED, S.QUEUED),  # resumed from its history
    (S.FAILED, S.QUEUED),
}
ALL_PAIRS = [(a, b) for a in S for b in S]


@pytest.mark.parametrize(("before", "after"), ALL_PAIRS)
def test_the_lifecycle_allows_exactly_its_transitions(before, after):
    row = Search(status=before)
    assert row.can_become(after) == ((before, after) in LEGAL)


@pytest.mark.parametrize(
    ("status", "action"),
    [
        (S.QUEUED, "pause"),
        (S.QUEUED, "resume"),
        (S.RUNNING, "resume"),
        (S.RUNNING, "start"),
        (S.PAUSED, "pause"),
        (S.STOPPING, "resume"),
        (S.STOPPING, "pause"),
        (S.STOPPING, "stop"),
        (S.FINISHED, "start"),
        (S.FINISHED, "pause"),
        (S.FINISHED, "fail"),
        (S.FAILED, "start"),  # it resumes through queued, not straight to running
        (S.FAILED, "finish"),
    ],
)
def test_an_illegal_transition_raises_and_leaves_the_row_alone(status, action):
    row = Search(pk=3, status=status, stop_reason="before")
    now = timezone.now()
    calls = {
        "start": lambda: row.start(now),
        "pause": row.pause,
        "resume": row.resume,
        "stop": lambda: row.request_stop("stopped by user"),
        "finish": lambda: row.finish(now, "done"),
        "fail": lambda: row.fail(now, "boom"),
    }
    with pytest.raises(IllegalTransition, match=f"search 3 is {status}"):
        calls[action]()
    assert (row.status, row.stop_reason, row.finished_at) == (status, "before", None)


def test_starting_a_search_queues_it(idea, engineer):
    search = services.start_search(idea=idea, user=engineer, seed=11, plateau_patience=5)
    stored = Search.objects.get()
    assert stored.pk == search.pk
    assert (stored.status, stored.seed, stored.plateau_patience) == (S.QUEUED, 11, 5)
    assert (stored.idea, stored.created_by) == (idea, engineer)
    assert stored.started_at is None and stored.trials_total == 0
    assert stored.to_dict()["status"] == "queued"


def test_a_search_gets_a_random_seed_when_none_is_given(idea, engineer):
    seeds = {services.start_search(idea=idea, user=engineer).seed for _ in range(4)}
    assert len(seeds) > 1


def test_a_double_clicked_start_creates_one_search(idea, engineer):
    first = services.start_search(idea=idea, user=engineer, request_key="form-123")
    again = services.start_search(idea=idea, user=engineer, request_key="form-123")
    assert first.pk == again.pk
    assert Search.objects.count() == 1
    services.start_search(idea=idea, user=engineer, request_key="form-124")
    assert Search.objects.count() == 2


def test_a_request_key_cannot_start_a_search_on_another_idea(idea, engineer):
    other = services.create_idea(**idea_kwargs(engineer, title="other"))
    services.start_search(idea=idea, user=engineer, request_key="k")
    with pytest.raises(DomainError, match="already started search"):
        services.start_search(idea=other, user=engineer, request_key="k")
    assert Search.objects.filter(idea=other).count() == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"request_key": "x" * 101}, "request_key"),
        ({"request_key": "  "}, "request_key"),
        ({"seed": -1}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"plateau_patience": 0}, "plateau_patience"),
    ],
)
def test_a_start_with_bad_options_is_refused(idea, engineer, kwargs, field):
    with pytest.raises(DomainError) as caught:
        services.start_search(idea=idea, user=engineer, **kwargs)
    assert field in caught.value.message_dict
    assert Search.objects.count() == 0


def test_only_engineers_start_searches(idea, outsider):
    with pytest.raises(PermissionDenied):
        services.start_search(idea=idea, user=outsider)
    assert Search.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_with_one_request_key_create_one_search(engineer):
    idea = services.create_idea(**idea_kwargs(engineer))
    barrier = threading.Barrier(2)
    results, errors = [], []

    def click() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(services.start_search(idea=idea, user=engineer, request_key="dbl").pk)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == 2 and results[0] == results[1]
    assert Search.objects.count() == 1


def test_the_orchestrator_begins_a_queued_search(queued_search):
    before = timezone.now()
    search = services.begin_search(search=queued_search)
    stored = Search.objects.get()
    assert stored.status == S.RUNNING
    assert stored.started_at >= before
    assert search.started_at == stored.started_at


def test_pause_resume_and_stop_by_an_engineer(search, engineer, reviewer):
    services.pause_search(search=search, user=engineer)
    assert Search.objects.get().status == S.PAUSED
    services.resume_search(search=search, user=reviewer)
    assert Search.objects.get().status == S.RUNNING
    services.stop_search(search=search, user=engineer)
    stored = Search.objects.get()
    assert (stored.status, stored.stop_reason) == (S.STOPPING, StopReason.USER)
    assert stored.finished_at is None  # the orchestrator finishes it once nothing is in flight


def test_a_paused_search_can_be_stopped(search, engineer):
    services.pause_search(search=search, user=engineer)
    services.stop_search(search=search, user=engineer)
    assert Search.objects.get().status == S.STOPPING


@pytest.mark.parametrize("action", ["pause_search", "resume_search", "stop_search"])
def test_only_engineers_control_a_search(search, outsider, action):
    with pytest.raises(PermissionDenied):
        getattr(services, action)(search=search, user=outsider)
    assert Search.objects.get().status == S.RUNNING


def test_resuming_a_running_search_is_refused_with_the_reason(search, engineer):
    with pytest.raises(IllegalTransition, match="is running: only a paused or ended one resumes"):
        services.resume_search(search=search, user=engineer)
    assert Search.objects.get().status == S.RUNNING


@pytest.mark.parametrize("end", ["fail", "finish"])
def test_an_ended_search_resumes_from_its_history(search, engineer, end):
    from tests.web.domain import propose

    trial = propose(search, 1)
    if end == "fail":
        services.fail_search(search=search, reason="the LLM endpoint gave no reply")
    else:
        services.finish_search(search=search, reason=StopReason.USER)
    resumed = services.resume_search(search=search, user=engineer)
    stored = Search.objects.get()
    assert (stored.status, stored.stop_reason, stored.finished_at) == (S.QUEUED, "", None)
    assert resumed.status == S.QUEUED
    assert list(stored.trials.values_list("pk", flat=True)) == [trial.pk]  # its history stays
    services.begin_search(search=stored)
    assert Search.objects.get().status == S.RUNNING


def test_a_search_ending_error_is_logged_without_the_key(search, caplog):
    with caplog.at_level("ERROR", logger="searches.services"):
        services.fail_search(
            search=search, reason="refused the API key sk-live-never-show-me-123456 (401)"
        )
    (record,) = [r for r in caplog.records if r.name == "searches.services"]
    text = record.getMessage()
    assert f"search {search.pk} failed" in text and "(401)" in text
    assert "never-show-me" not in text and "sk-***" in text


def test_pausing_a_finished_search_is_refused(search, engineer):
    services.finish_search(search=search, reason="budget: trials (1 of 1)")
    with pytest.raises(IllegalTransition, match="is finished: it cannot become paused"):
        services.pause_search(search=search, user=engineer)
    assert Search.objects.get().status == S.FINISHED


def test_a_stopped_search_finishes_with_the_users_reason(search, engineer):
    services.stop_search(search=search, user=engineer)
    now = timezone.now()
    services.finish_search(search=search, now=now)
    stored = Search.objects.get()
    assert (stored.status, stored.stop_reason, stored.finished_at) == (
        S.FINISHED,
        "stopped by user",
        now,
    )


def test_finishing_a_running_search_passes_through_stopping(search):
    services.finish_search(search=search, reason="plateau (20 trials in a row)")
    stored = Search.objects.get()
    assert (stored.status, stored.stop_reason) == (S.FINISHED, "plateau (20 trials in a row)")
    assert stored.finished_at is not None


def test_finishing_twice_changes_nothing(search):
    first = services.finish_search(search=search, reason="budget: trials (5 of 5)")
    again = services.finish_search(search=search, reason="something else")
    stored = Search.objects.get()
    assert stored.stop_reason == "budget: trials (5 of 5)"
    assert again.finished_at == first.finished_at == stored.finished_at


def test_the_orchestrator_requests_a_stop_with_its_reason(search):
    services.request_stop(search=search, reason="budget: gpu minutes (30.0 of 30)")
    stored = Search.objects.get()
    assert (stored.status, stored.stop_reason) == (S.STOPPING, "budget: gpu minutes (30.0 of 30)")
    with pytest.raises(DomainError, match="Say why"):
        services.request_stop(search=search, reason=" ")


@pytest.mark.parametrize("status", [S.QUEUED, S.RUNNING, S.PAUSED, S.STOPPING])
def test_any_unfinished_search_can_fail(idea, engineer, status):
    search = services.start_search(idea=idea, user=engineer)
    Search.objects.filter(pk=search.pk).update(status=status)
    services.fail_search(search=search, reason="orchestrator crashed: KeyError 'x'")
    stored = Search.objects.get()
    assert stored.status == S.FAILED
    assert stored.stop_reason == "error: orchestrator crashed: KeyError 'x'"
    assert stored.finished_at is not None


def test_failing_twice_keeps_the_first_reason(search):
    services.fail_search(search=search, reason="first")
    services.fail_search(search=search, reason="second")
    assert Search.objects.get().stop_reason == "error: first"


def test_a_finished_search_cannot_fail(search):
    services.finish_search(search=search, reason="done")
    with pytest.raises(IllegalTransition):
        services.fail_search(search=search, reason="late")
    assert Search.objects.get().status == S.FINISHED


def test_a_fail_needs_a_reason(search):
    with pytest.raises(DomainError, match="Say why"):
        services.fail_search(search=search, reason="")
    assert Search.objects.get().status == S.RUNNING


def test_budget_shows_used_against_allowed(search):
    Search.objects.filter(pk=search.pk).update(
        trials_total=3, gpu_seconds=90, tokens=10, started_at=timezone.now() - timedelta(minutes=6)
    )
    budget = Search.objects.select_related("idea").get().budget(now=timezone.now())
    assert budget["trials"] == {"used": 3, "max": 50}
    assert budget["gpu_minutes"] == {"used": 1.5, "max": 30}
    assert budget["wall_minutes"]["max"] == 60 and 5.9 < budget["wall_minutes"]["used"] < 6.5
    assert budget["tokens"] == {"used": 10, "max": None}
