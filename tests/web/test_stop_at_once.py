"""Stop ends a search at once when nothing of it runs: a search aimed at a GPU kind with no
worker online has its trial queued forever, and Stop used to leave it "Stopping" for good
(also after a restart). Real Redis and RQ queues; the orchestrator's pass runs in-process."""

from __future__ import annotations

import pytest
from django.urls import reverse

from kernels.worker import queue_name, register, rq_queue
from searches import orchestrator, services
from searches.models import Search, Trial

pytestmark = pytest.mark.django_db(transaction=True)

S = Search.Status


def _pass(search: Search) -> None:
    """One orchestrator pass over the search, as `run_search` makes it."""
    loop = orchestrator.Loop(search.pk)
    assert loop.lease.acquire()
    try:
        loop.step()
    finally:
        loop.lease.release()


def _gpu_queue(redis_url) -> list[str]:
    key = rq_queue(queue_name("h200"), redis_url).key
    return [i.decode() for i in redis_url.lrange(key, 0, -1)]


@pytest.fixture
def stuck(redis_url, queued_search):
    """A tuner search on h200 with no h200 worker online: trial 1 queued, waiting."""
    _pass(queued_search)
    trial = Trial.objects.get(search=queued_search)
    assert trial.status == Trial.Status.QUEUED and _gpu_queue(redis_url) == [trial.job_id]
    return Search.objects.get(pk=queued_search.pk)


def test_the_search_page_says_its_trial_waits_for_a_worker_of_its_kind(engineer_client, stuck):
    html = engineer_client.get(reverse("searches:search", args=[stuck.pk])).content.decode()
    assert "trial 1 is waiting for an h200 worker (none has been online)" in html


def test_stop_with_nothing_running_ends_the_search_at_once(engineer_client, stuck, redis_url):
    response = engineer_client.post(
        reverse("searches:search_stop", args=[stuck.pk]), headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    stored = Search.objects.get(pk=stuck.pk)
    assert (stored.status, stored.stop_reason) == (S.FINISHED, "stopped by user")
    assert 'badge-finished"' in response.content.decode()
    assert _gpu_queue(redis_url) == []  # the job left the queue: no worker will run it later
    trial = stored.trials.get()
    # Not evaluated, and not counted as an attempt: a resumed search evaluates it.
    assert (trial.status, trial.job_id, trial.attempts) == (Trial.Status.PROPOSED, None, 0)
    page = engineer_client.get(reverse("searches:trial", args=[stuck.pk, 1])).content.decode()
    assert "the search ended before a worker took this trial" in page
    assert "waiting for an h200 worker" not in page

    services.resume_search(search=stored, user=stored.created_by)
    _pass(stored)
    trial.refresh_from_db()
    assert trial.status == Trial.Status.QUEUED and _gpu_queue(redis_url) == [trial.job_id]
    assert trial.attempts == 1


def test_a_search_left_stopping_before_a_restart_ends_on_the_first_pass(stuck, redis_url):
    # Stopped while no orchestrator ran (or by a version that waited for the queued trial).
    services.stop_search(search=stuck, user=stuck.created_by)
    assert Search.objects.get(pk=stuck.pk).status == S.STOPPING
    orchestrator.recover()  # the orchestrator's start-up
    assert orchestrator.run_search(stuck.pk, poll_s=0.01, slice_s=1.0) == S.FINISHED
    assert _gpu_queue(redis_url) == []


def test_a_trial_a_worker_has_taken_finishes_before_the_search_does(
    engineer_client, stuck, redis_url
):
    trial = stuck.trials.get()
    register(redis_url, "gpuhost:gpu0", {"kind": "h200", "queue": queue_name("h200")})
    # A worker takes the job off the queue (as RQ's worker does) and is evaluating it.
    job, _ = rq_queue(queue_name("h200"), redis_url).dequeue_any(
        [rq_queue(queue_name("h200"), redis_url)], None, connection=redis_url
    )
    assert job.id == trial.job_id
    engineer_client.post(reverse("searches:search_stop", args=[stuck.pk]))
    assert Search.objects.get(pk=stuck.pk).status == S.STOPPING
    trial.refresh_from_db()
    assert (trial.status, trial.job_id) == (Trial.Status.QUEUED, job.id)
    html = engineer_client.get(reverse("searches:search", args=[stuck.pk])).content.decode()
    assert "waiting for an h200 worker" not in html  # one is online, and has it


def test_with_a_worker_of_its_kind_online_a_queued_trial_still_runs_after_stop(
    engineer_client, stuck, redis_url
):
    """A worker will take it soon (it may be busy with other searches' jobs): the trial was
    proposed and counted, so it is evaluated, as before, and the search waits for it."""
    trial = stuck.trials.get()
    register(redis_url, "gpuhost:gpu0", {"kind": "h200", "queue": queue_name("h200")})
    engineer_client.post(reverse("searches:search_stop", args=[stuck.pk]))
    assert Search.objects.get(pk=stuck.pk).status == S.STOPPING
    assert _gpu_queue(redis_url) == [trial.job_id]
    trial.refresh_from_db()
    assert trial.status == Trial.Status.QUEUED
    # Its worker goes away (the heartbeat expires) before taking it: the next pass ends it.
    redis_url.delete("autoweb:worker:gpuhost:gpu0")
    _pass(stuck)
    assert Search.objects.get(pk=stuck.pk).status == S.FINISHED
    assert _gpu_queue(redis_url) == []


def test_a_stopped_search_left_with_a_job_the_orchestrator_re_enqueued_still_ends(stuck, redis_url):
    """A lost evaluation is queued again by the stopping pass; the same pass withdraws it."""
    trial = stuck.trials.get()
    redis_url.delete(rq_queue(queue_name("h200"), redis_url).key)
    redis_url.delete(f"rq:job:{trial.job_id}")  # the job is gone (Redis lost it)
    services.stop_search(search=stuck, user=stuck.created_by)
    _pass(stuck)
    stored = Search.objects.get(pk=stuck.pk)
    assert stored.status == S.FINISHED
    assert _gpu_queue(redis_url) == []


@pytest.mark.slow
def test_with_a_real_orchestrator_driving_it_stop_ends_the_search_within_a_pass(
    engineer_client, queued_search, redis_url, env
):
    """`manage.py orchestrator` holds the search's lease while it serves it, so the web leaves
    the stop to the loop: its next pass withdraws the waiting job and finishes the search."""
    import time

    from django.db import transaction

    procs = env["procs"]
    with transaction.atomic():
        orchestrator.enqueue_search(queued_search)
    procs.start("manage.py", "orchestrator")
    deadline = time.monotonic() + 120
    while not Trial.objects.filter(search=queued_search, status=Trial.Status.QUEUED).exists():
        assert time.monotonic() < deadline, procs.log_tails()
        time.sleep(0.2)
    engineer_client.post(reverse("searches:search_stop", args=[queued_search.pk]))
    stopped = time.monotonic()
    while Search.objects.get(pk=queued_search.pk).status != S.FINISHED:
        assert time.monotonic() - stopped < 10, procs.log_tails()
        time.sleep(0.1)
    procs.stop_all()
    assert _gpu_queue(redis_url) == []
    assert Trial.objects.get(search=queued_search).status == Trial.Status.PROPOSED
