"""Faults at the transaction boundary, with a real RQ queue on a real Redis: a job enqueued in
a transaction that rolls back never reaches the queue, and a double-clicked start (two
concurrent POSTs of one form) creates one search. Runs on PostgreSQL when DATABASE_URL says so.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from rq import Queue

from core.control import search_queue
from kernels.protocol import queue_name
from searches import services
from searches.models import Search, Trial
from searches.orchestrator import Loop, enqueue_search
from tests.web.domain import idea_kwargs, propose

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def test_a_search_enqueued_in_a_transaction_that_rolls_back_never_runs(redis_url, queued_search):
    queue = search_queue(redis_url)

    with pytest.raises(Boom), transaction.atomic():
        enqueue_search(queued_search)
        raise Boom

    assert queue.count == 0
    assert queue.job_ids == []
    # The same call, committed, does enqueue: the empty queue above is the rollback's doing.
    with transaction.atomic():
        enqueue_search(queued_search)
    assert queue.count == 1
    assert tuple(queue.jobs[0].args) == (queued_search.pk,)


def test_an_evaluation_enqueued_in_a_transaction_that_rolls_back_never_runs(redis_url, search):
    trial = propose(search, 1)
    queue = Queue(queue_name("interpret"), connection=redis_url)
    loop = Loop(search.pk, conn=redis_url)

    with pytest.raises(Boom), transaction.atomic():
        loop.enqueue(trial, "interpret", attempt=1)
        raise Boom

    assert queue.count == 0
    stored = Trial.objects.get(pk=trial.pk)
    assert (stored.status, stored.job_id, stored.attempts) == (trial.status, trial.job_id, 0)
    with transaction.atomic():
        loop.enqueue(trial, "interpret", attempt=1)
    assert queue.job_ids == [Trial.objects.get(pk=trial.pk).job_id]


def test_a_double_clicked_start_creates_one_search(redis_url, engineer):
    idea = services.create_idea(**idea_kwargs(engineer))
    key = "double-click-42"
    barrier = threading.Barrier(2)
    responses, errors = [], []

    def click() -> None:
        client = Client()
        client.force_login(engineer)
        try:
            barrier.wait(timeout=10)
            responses.append(
                client.post(
                    reverse("searches:idea_start", args=[idea.pk]),
                    {"request_key": key},
                    follow=False,
                )
            )
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == []
    assert Search.objects.count() == 1
    search = Search.objects.get()
    assert search.request_key == key
    assert [r.status_code for r in responses] == [302, 302]
    assert {r["Location"] for r in responses} == {reverse("searches:search", args=[search.pk])}
    # Each click may enqueue the loop (a duplicate loop exits at once: it holds no lease),
    # but every job drives this one search.
    jobs = search_queue(redis_url).jobs
    assert 1 <= len(jobs) <= 2
    assert {tuple(j.args) for j in jobs} == {(search.pk,)}
