"""Recording re-validation jobs: finished, failed, lost; the watcher's lease."""

from __future__ import annotations

import time

import pytest
from rq.results import Result

from kernels.queues import fetch_job, rq_queue
from library import services, watch
from library.models import Release, Revalidation
from searches.models import Idea
from tests.library.helpers import candidate

pytestmark = pytest.mark.django_db


@pytest.fixture
def approval(search, reviewer, redis_url, django_capture_on_commit_callbacks):
    Idea.objects.filter(pk=search.idea_id).update(target_kinds=["interpret"])
    search.refresh_from_db()
    trial = candidate(search)
    with django_capture_on_commit_callbacks(execute=True):
        review = services.decide(
            trial=trial, user=reviewer, action="approve", shape_range={"N": [1, 4096]}
        )
    return review


def _finish(conn, job_id: str, result) -> None:
    job = fetch_job(job_id, conn)
    rq_queue("gpu.interpret", conn).remove(job)
    # What a worker leaves behind: a successful result and the finished status.
    Result.create(job, Result.Type.SUCCESSFUL, ttl=600, return_value=result)
    job.set_status("finished")


def test_a_finished_job_is_recorded_and_released(approval, redis_url):
    reval = approval.revalidations.get()
    report = {
        "verdict": "accepted",
        "failure": None,
        "reasons": [],
        "dtype": "float32",
        "summary": {},
        "checks": {},
        "shapes": [],
        "revalidation": {"passed": True, "reasons": []},
    }
    _finish(redis_url, reval.job_id, report)
    assert services.poll(review=approval, conn=redis_url) is True
    assert Revalidation.objects.get().status == "passed"
    assert Release.objects.count() == 1
    assert services.poll(review=approval, conn=redis_url) is True  # again: no change
    assert Release.objects.count() == 1


def test_a_lost_job_runs_again_then_fails_after_max_attempts(
    approval, redis_url, django_capture_on_commit_callbacks
):
    queue = rq_queue("gpu.interpret", redis_url)
    for attempt in range(2, services.MAX_ATTEMPTS + 1):
        queue.empty()  # the job and its data disappear (Redis flushed, say)
        with django_capture_on_commit_callbacks(execute=True):
            assert services.poll(review=approval, conn=redis_url) is False
        reval = approval.revalidations.get()
        assert reval.attempts == attempt and reval.job_id.endswith(f"-a{attempt}")
        assert [j.id for j in queue.jobs] == [reval.job_id]
    queue.empty()
    assert services.poll(review=approval, conn=redis_url) is True
    reval = approval.revalidations.get()
    assert reval.status == "failed" and "lost" in reval.reasons[0]
    assert approval.outcome == "rejected by re-validation"
    assert not Release.objects.exists()


def test_a_second_watcher_steps_aside(approval, redis_url):
    redis_url.set(watch.lease_key(approval.pk), "someone")
    assert watch.watch(approval.pk) == "another watcher holds this review"


def test_recover_starts_a_watcher_per_approval_still_revalidating(approval, redis_url):
    rq_queue("search", redis_url).empty()
    assert watch.recover() == 1
    assert [tuple(j.args) for j in rq_queue("search", redis_url).jobs] == [(approval.pk,)]


def test_a_watcher_hands_over_after_one_pass_while_another_job_waits(approval, redis_url):
    queue = rq_queue("search", redis_url)
    assert len(queue.jobs) == 1  # the approval's own watcher, not started yet: it waits
    started = time.monotonic()
    assert watch.watch(approval.pk, poll_s=0.01, slice_s=60) == "continuing"
    assert time.monotonic() - started < 10  # one pass, not the slice's 60 s
    assert [tuple(j.args) for j in queue.jobs] == [(approval.pk,), (approval.pk,)]
    assert redis_url.get(watch.lease_key(approval.pk)) is None  # the next slice may take it


def test_a_watcher_alone_on_the_queue_keeps_watching_for_its_slice(approval, redis_url):
    queue = rq_queue("search", redis_url)
    queue.empty()
    started = time.monotonic()
    assert watch.watch(approval.pk, poll_s=0.05, slice_s=0.5) == "continuing"
    assert time.monotonic() - started >= 0.5
    assert [tuple(j.args) for j in queue.jobs] == [(approval.pk,)]
