"""The orchestrator's forwarding step: workers' progress events coalesced per trial within a
poll, applied in one transaction and sent as one rendered group message; no status transition
(a change of phase, a verdict) is ever merged away."""

from __future__ import annotations

import re

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connection

from kernels.queues import publish
from searches import live, services
from searches.models import Trial
from searches.orchestrator import Loop, coalesce
from tests.web.domain import propose, rejected
from tests.web.test_live_consumer import (  # noqa: F401 (fixtures)
    PREFIX,
    REDIS_URL,
    anyio_backend,
    channel_layer,
)

db = database_sync_to_async


def ev(trial: int, phase: str, shape: int | None = None, of: int = 8) -> dict:
    event = {"type": "trial_phase", "trial": trial, "phase": phase}
    if shape is not None:
        event.update(shape=shape, of=of)
    return event


# -- the pure rule --------------------------------------------------------------------------------


def test_coalescing_keeps_the_latest_progress_per_trial_and_every_change_of_phase():
    events = [
        ev(1, "compiling"),
        ev(1, "verifying", 1),
        ev(2, "verifying", 1, of=3),
        ev(1, "verifying", 2),
        ev(1, "verifying", 3),
        ev(2, "verifying", 2, of=3),
        ev(1, "benchmarking", 1),
        ev(2, "benchmarking", 1, of=3),
        ev(1, "benchmarking", 2),
    ]
    assert coalesce(events) == [
        ev(1, "compiling"),
        ev(1, "verifying", 3),  # where the run began, with its newest progress
        ev(2, "verifying", 2, of=3),
        ev(1, "benchmarking", 2),
        ev(2, "benchmarking", 1, of=3),
    ]


def test_coalescing_never_merges_a_verdict_and_a_verdict_ends_the_run():
    events = [
        ev(1, "benchmarking", 1),
        {"trial": 1, "type": "verdict", "phase": "kept"},
        {"trial": 1, "type": "verdict", "phase": "kept"},  # even a repeat is kept
        ev(1, "benchmarking", 2),  # a late one after the verdict: a run of its own
        ev(1, "benchmarking", 3),
        {"trial": 2, "type": "something new"},
    ]
    assert coalesce(events) == [
        events[0],
        events[1],
        events[2],
        events[4],
        events[5],
    ]


def test_coalescing_nothing_gives_nothing():
    assert coalesce([]) == []


# -- the forwarding step, end to end ---------------------------------------------------------------


def queued(search, i: int) -> Trial:
    return services.mark_trial_queued(trial=propose(search, i), job_id=f"job-{i}")


async def group_messages(channel: str) -> list[dict]:
    """Everything the group sent `channel` so far (read without waiting)."""
    conn = redis.Redis.from_url(REDIS_URL)
    n = conn.zcard(f"{PREFIX}{channel}")
    layer = get_channel_layer()
    return [await layer.receive(channel) for _ in range(n)]


def shown(row: dict) -> tuple[int, str, str | None]:
    """(trial, status, "i/n" progress or None) of a rendered row."""
    progress = re.search(r"(\d+/\d+)</span>", row["html"])
    return row["trial_id"], row["status"], progress.group(1) if progress else None


@pytest.fixture
def probe(search):
    name = f"live-coalesce-probe.{search.pk}"
    async_to_sync(get_channel_layer().group_add)(live.group_name(search.pk), name)
    return name


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_a_poll_applies_its_events_in_one_transaction_and_sends_one_message(
    search, redis_url, probe, monkeypatch
):
    a, b = await db(queued)(search, 1), await db(queued)(search, 2)
    for event in [
        ev(a.pk, "compiling"),
        *[ev(a.pk, "verifying", i) for i in range(1, 9)],
        ev(b.pk, "compiling"),
        ev(b.pk, "verifying", 1),
        ev(b.pk, "verifying", 2),
        ev(a.pk, "benchmarking", 1),
        ev(a.pk, "benchmarking", 2),
        ev(a.pk, "compiling"),  # late: the trial has moved on, nothing new to show
    ]:
        publish(redis_url, search.pk, event)
    sends = []
    real_send = live._send
    monkeypatch.setattr(
        live, "_send", lambda sid, payload: sends.append(sid) or real_send(sid, payload)
    )
    applied = []  # per phase applied: the outermost transaction it ran in
    real_mark = services.mark_trial_phase

    def mark(**kwargs):
        blocks = connection.atomic_blocks
        applied.append(id(blocks[0]) if blocks else None)
        return real_mark(**kwargs)

    monkeypatch.setattr(services, "mark_trial_phase", mark)

    await db(Loop(search.pk, conn=redis_url).forward_events)()

    assert sends == [search.pk]  # one group message for the whole poll
    # 15 events, 6 after coalescing (the late "compiling" is applied, and changes nothing),
    # all in one transaction.
    assert len(applied) == 6
    assert None not in applied and len(set(applied)) == 1
    (message,) = await group_messages(probe)
    assert message["kind"] == "rows"
    assert [shown(r) for r in message["rows"]] == [
        (a.pk, "compiling", None),
        (a.pk, "verifying", "8/8"),
        (b.pk, "compiling", None),
        (b.pk, "verifying", "2/8"),
        (a.pk, "benchmarking", "2/8"),
    ]
    statuses = await db(lambda: dict(Trial.objects.values_list("pk", "status")))()
    assert statuses == {a.pk: "benchmarking", b.pk: "verifying"}

    # The cursor moved: the next poll finds nothing and sends nothing.
    await db(Loop(search.pk, conn=redis_url).forward_events)()
    assert sends == [search.pk]
    assert await group_messages(probe) == []


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_every_verdict_reaches_the_group_after_the_progress_before_it(
    search, redis_url, probe
):
    a, b = await db(queued)(search, 1), await db(queued)(search, 2)
    for i in range(1, 6):
        publish(redis_url, search.pk, ev(a.pk, "verifying", i, of=5))
        publish(redis_url, search.pk, ev(b.pk, "verifying", i, of=5))
    loop = Loop(search.pk, conn=redis_url)
    await db(loop.forward_events)()
    await db(loop.record)(a, rejected("incorrect"))
    await db(loop.record)(b, rejected("crashed"))
    rows = [shown(r) for m in await group_messages(probe) if m["kind"] == "rows" for r in m["rows"]]
    assert rows == [
        (a.pk, "verifying", "5/5"),
        (b.pk, "verifying", "5/5"),
        (a.pk, "failed", None),
        (b.pk, "failed", None),
    ]
    # Progress that arrives after the verdict changes nothing and is not pushed.
    publish(redis_url, search.pk, ev(a.pk, "benchmarking", 1))
    await db(loop.forward_events)()
    assert [m for m in await group_messages(probe) if m["kind"] == "rows"] == []
