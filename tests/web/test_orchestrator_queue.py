"""The `search` queue stays bounded and every search gets its turn: at most one loop job waits
per search (`orchestrator.enqueue_loop`), and a slice hands over after one pass while others
wait. Real Redis, RQ and the orchestrator process (`manage.py orchestrator`)."""

from __future__ import annotations

import time

import pytest
import redis
from django.contrib.auth import get_user_model

from core import control
from kernels.queues import fetch_job
from searches import orchestrator, services
from searches.models import Search
from tests.web.domain import queue_search

pytestmark = pytest.mark.django_db(transaction=True)


def _searches(n: int, kinds: list[str]) -> list[Search]:
    user = get_user_model().objects.create_user("eng", password="pw")
    services.grant_role(user=user, role="engineers")
    out = []
    for i in range(n):
        search = queue_search(
            user,
            title=f"search {i}",
            target_kinds=[kinds[i % len(kinds)]],
            prohibitions="",
            max_trials=5,
            max_wall_minutes=30,
        )
        out.append(search)
    return out


def _queued_searches(conn: redis.Redis) -> list[int]:
    ids = [i.decode() for i in conn.lrange("rq:queue:search", 0, -1)]
    return [fetch_job(i, conn).args[0] for i in ids]


def test_a_search_waits_in_the_queue_once_whoever_enqueues_it(env):
    (search,) = _searches(1, ["interpret"])
    conn = env["redis"]
    assert _queued_searches(conn) == [search.pk]
    assert orchestrator.enqueue_loop(conn, search.pk) is False
    assert orchestrator.sweep(conn) == 0  # no lease, but a loop job waits: nothing added
    assert _queued_searches(conn) == [search.pk]
    # The job it waited with is lost (the queue emptied by hand): the next enqueue replaces it.
    conn.delete("rq:queue:search")
    assert orchestrator.enqueue_loop(conn, search.pk) is True
    assert _queued_searches(conn) == [search.pk]


def test_twenty_searches_one_orchestrator_bounded_queue_and_every_search_gets_turns(env):
    # No GPU worker runs: the h200 searches can never run a trial (stuck), the interpreter
    # ones wait for a worker too; the orchestrator still has to serve all of them in turn.
    searches = _searches(20, ["interpret", "interpret", "interpret", "h200"])
    conn = env["redis"]
    assert len(_queued_searches(conn)) == 20
    env["procs"].start("manage.py", "orchestrator")
    started = time.monotonic()
    first_turn: dict[int, float] = {}
    longest, seen_twice = 0, set()
    while time.monotonic() - started < 40:
        queued = _queued_searches(conn)
        longest = max(longest, len(queued))
        assert len(queued) == len(set(queued)), f"a search waits twice: {queued}"
        for s in Search.objects.filter(pk__in=[x.pk for x in searches]).exclude(
            status=Search.Status.QUEUED
        ):
            first_turn.setdefault(s.pk, time.monotonic() - started)
        if len(first_turn) == 20:
            # After everyone's first turn, each search keeps coming back to the queue.
            seen_twice |= set(queued)
            if len(seen_twice) == 20:
                break
        time.sleep(0.1)
    assert len(first_turn) == 20, (
        f"searches never served: {sorted(set(s.pk for s in searches) - set(first_turn))}\n"
        + env["procs"].log_tails()
    )
    # From the orchestrator's first pass (its start-up, seconds on a loaded machine, is not
    # the queue's doing), every search had its first turn within a few seconds.
    assert max(first_turn.values()) - min(first_turn.values()) < 15, first_turn
    assert longest <= 21, longest  # one job per search (+ one handing over)
    assert len(seen_twice) == 20, f"searches with one turn only: {set(first_turn) - seen_twice}"


def test_a_search_handed_straight_back_waits_out_its_poll_interval(env):
    # Two searches, one orchestrator: a slice hands over after one pass because the other
    # search's job waits, and the search comes straight back. Its next pass still waits until
    # poll_s has passed since its last one, so two searches are not stepped back to back
    # dozens of times a second.
    a, _b = _searches(2, ["h200"])  # no worker: a pass enqueues a trial and returns
    conn = env["redis"]

    started = time.monotonic()
    orchestrator.run_search(a.pk, poll_s=5.0, slice_s=60)
    assert time.monotonic() - started < 4.0  # no earlier pass: no wait
    first = float(conn.get(control.pass_key(f"search-{a.pk}")))
    assert len(_queued_searches(conn)) == 2  # handed over after one pass, waiting again

    orchestrator.run_search(a.pk, poll_s=0.6, slice_s=60)

    second = float(conn.get(control.pass_key(f"search-{a.pk}")))
    assert second - first >= 0.6, (first, second)
