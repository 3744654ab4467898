"""The search's live socket, through the real ASGI stack (Origin check, session auth, routing)
and the real channels_redis layer on a dedicated Redis database."""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client
from django.utils import timezone

from autoweb.asgi import application
from searches import consumers, live, services
from searches.consumers import NEWEST
from searches.models import Search, Trial
from tests.conftest import channel_layers, test_redis_url
from tests.web.domain import idea_kwargs, propose

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

REDIS_URL = test_redis_url(8)
# One prefix per test process: parallel runs (xdist) number their searches from 1 too.
PREFIX = f"autoweb-test-live-{os.getpid()}"
ORIGIN = "http://localhost"
WAIT = 5


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def channel_layer(settings):
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    settings.CHANNEL_LAYERS = channel_layers(settings.CHANNEL_LAYERS, REDIS_URL, PREFIX)
    conn = redis.Redis.from_url(REDIS_URL)
    for key in conn.scan_iter(f"{PREFIX}*"):
        conn.delete(key)
    yield
    for key in conn.scan_iter(f"{PREFIX}*"):
        conn.delete(key)


def login_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[django_settings.SESSION_COOKIE_NAME].value


@pytest.fixture
def engineer_cookie(engineer) -> str:
    return login_cookie(engineer)


def socket(search_id: int, cookie: str | None = None, origin: str | None = ORIGIN):
    headers = []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if cookie is not None:
        headers.append((b"cookie", f"{django_settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/searches/{search_id}/", headers=headers)


async def connected(search_id: int, cookie: str) -> tuple[object, list[str]]:
    """An open socket and its catch-up frames (the status, then the newest rows if any)."""
    ws = socket(search_id, cookie)
    ok, _ = await ws.connect(timeout=WAIT)
    assert ok
    frames = [await ws.receive_from(timeout=WAIT)]
    while not await ws.receive_nothing(timeout=0.2):
        frames.append(await ws.receive_from(timeout=WAIT))
    return ws, frames


async def closed_with(ws) -> int:
    message = await ws.receive_output(timeout=WAIT)
    assert message["type"] == "websocket.close", message
    return message["code"]


def row_ids(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<tr\b[^>]*\bid="trial-(\d+)"', html)]


db = database_sync_to_async


# -- who may connect ---------------------------------------------------------------------------


async def test_an_anonymous_socket_is_closed_with_4401(search):
    ws = socket(search.pk, cookie=None)
    ok, _ = await ws.connect(timeout=WAIT)
    assert ok  # accepted, then closed with a code: a refused handshake makes htmx retry forever
    assert await closed_with(ws) == 4401
    await ws.disconnect()


async def test_a_user_in_no_role_is_closed_with_4403(search, outsider):
    ws = socket(search.pk, await db(login_cookie)(outsider))
    assert (await ws.connect(timeout=WAIT))[0]
    assert await closed_with(ws) == 4403
    await ws.disconnect()


async def test_a_search_that_does_not_exist_is_closed_with_4404(search, engineer_cookie):
    ws = socket(search.pk + 1000, engineer_cookie)
    assert (await ws.connect(timeout=WAIT))[0]
    assert await closed_with(ws) == 4404
    await ws.disconnect()


@pytest.mark.parametrize("origin", ["http://evil.example", "http://localhost.evil.example", None])
async def test_a_foreign_or_missing_origin_is_refused_at_the_handshake(
    search, engineer_cookie, origin
):
    ws = socket(search.pk, engineer_cookie, origin=origin)
    ok, _ = await ws.connect(timeout=WAIT)
    assert not ok
    await ws.disconnect()


# -- catch-up ----------------------------------------------------------------------------------


async def test_connecting_sends_the_status_and_the_newest_trials_from_the_database(
    search, engineer_cookie
):
    first = await db(propose)(search, 1)
    second = await db(propose)(search, 2)
    ws, (status, rows) = await connected(search.pk, engineer_cookie)
    assert status.startswith('<section hx-swap-oob="true" id="search-status"')
    assert "running" in status.lower()
    assert rows.startswith(f'<tbody id="trial-rows" hx-swap-oob="innerHTML:{NEWEST}">')
    assert row_ids(rows) == [second.pk, first.pk]  # newest first, as the page lists them
    await ws.disconnect()


async def test_a_search_without_trials_gets_only_the_status(search, engineer_cookie):
    ws, frames = await connected(search.pk, engineer_cookie)
    assert len(frames) == 1  # no empty tbody: the page's "no trial yet" row stays
    assert 'id="search-status"' in frames[0]
    await ws.disconnect()


async def test_the_catch_up_holds_one_page_of_trials_not_the_whole_search(
    search, engineer_cookie, monkeypatch
):
    monkeypatch.setattr(consumers, "CATCH_UP_ROWS", 3)
    trials = [await db(propose)(search, i) for i in range(5)]
    ws, (_, rows) = await connected(search.pk, engineer_cookie)
    assert row_ids(rows) == [t.pk for t in reversed(trials)][:3]
    # An older trial (page 2) changing is not inserted at the top of page 1, but replaced in
    # place, where a browser that paged to page 2 shows it.
    await sync_to_async(live.trial_changed)(trials[0])
    frame = await ws.receive_from(timeout=WAIT)
    assert f'id="trial-{trials[0].pk}"' in frame and 'hx-swap-oob="true"' in frame, frame[:200]
    assert "trial-rows" not in frame
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


async def test_a_reconnecting_client_gets_what_it_missed_while_away(
    search, engineer, engineer_cookie
):
    ws, _ = await connected(search.pk, engineer_cookie)
    await ws.disconnect()
    # While the browser is away the loop moves on; no event reaches anyone.
    trial = await db(propose)(search, 1)
    await db(services.mark_trial_queued)(trial=trial, job_id="job-1")
    await db(services.pause_search)(search=search, user=engineer)
    ws, (status, rows) = await connected(search.pk, engineer_cookie)
    assert "paused" in status.lower()
    assert row_ids(rows) == [trial.pk]
    assert "queued" in rows.lower()
    await ws.disconnect()


# -- live events -------------------------------------------------------------------------------


async def test_a_new_trial_is_inserted_at_the_top_then_updated_in_place(search, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    trial = await db(propose)(search, 1)
    await sync_to_async(live.trial_changed)(trial)
    inserted = await ws.receive_from(timeout=WAIT)
    assert inserted.startswith(f'<tbody id="trial-rows" hx-swap-oob="afterbegin:{NEWEST}">')
    assert f'id="trial-{trial.pk}"' in inserted
    assert "proposed" in inserted.lower()

    trial = await db(services.mark_trial_queued)(trial=trial, job_id="job-1")
    trial = await db(services.mark_trial_phase)(trial=trial, phase="verifying")
    await sync_to_async(live.trial_changed)(
        trial, event={"phase": "verifying", "shape": 3, "of": 8}
    )
    replaced = await ws.receive_from(timeout=WAIT)
    assert replaced.startswith(f'<tr hx-swap-oob="true" id="trial-{trial.pk}"')
    assert "verifying" in replaced.lower()
    await ws.disconnect()


async def test_the_row_pushed_is_the_database_row_not_the_event(search, engineer_cookie):
    trial = await db(propose)(search, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    await get_channel_layer().group_send(
        live.group_name(search.pk),
        {"type": "search.event", "kind": "trial", "trial_id": trial.pk, "status": "kept"},
    )
    row = await ws.receive_from(timeout=WAIT)
    assert row_ids(row) == [trial.pk]
    assert "proposed" in row.lower()
    assert "kept" not in row.lower()
    await ws.disconnect()


async def test_another_searchs_trials_never_reach_this_socket(search, engineer, engineer_cookie):
    other = await db(_other_search)(engineer)
    foreign = await db(propose)(other, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    await sync_to_async(live.trial_changed)(foreign)
    # Even a hint on this search's group naming the other search's trial finds nothing.
    await get_channel_layer().group_send(
        live.group_name(search.pk),
        {"type": "search.event", "kind": "trial", "trial_id": foreign.pk, "status": "kept"},
    )
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


def _other_search(user) -> Search:
    idea = services.create_idea(**idea_kwargs(user, title="Another idea"))
    return services.begin_search(search=services.start_search(idea=idea, user=user, seed=1))


async def test_a_search_change_pushes_the_status_section(search, engineer, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    paused = await db(services.pause_search)(search=search, user=engineer)
    await sync_to_async(live.search_changed)(paused)
    status = await ws.receive_from(timeout=WAIT)
    assert status.startswith('<section hx-swap-oob="true" id="search-status"')
    assert "paused" in status.lower()
    await ws.disconnect()


async def test_the_status_push_carries_the_trial_count_and_the_start_time(
    search, engineer, engineer_cookie
):
    ws, (status,) = await connected(search.pk, engineer_cookie)
    assert '<span id="trials-total" class="muted" hx-swap-oob="true">' in status
    assert "0 in all" in status
    await db(propose)(search, 1)
    await db(propose)(search, 2)
    fresh = await db(Search.objects.select_related("idea", "created_by").get)(pk=search.pk)
    await sync_to_async(live.search_changed)(fresh)
    frame = await ws.receive_from(timeout=WAIT)
    assert frame.startswith('<section hx-swap-oob="true" id="search-status"')
    total = re.search(r'<span id="trials-total" [^>]*hx-swap-oob="true">([^<]*)</span>', frame)
    assert total and total.group(1).endswith("2 in all")
    started = re.search(r'<span id="search-started" hx-swap-oob="true">(.*?)</span>', frame, re.S)
    assert started and "started by ada" in started.group(1) and "ago" in started.group(1)
    assert f'datetime="{search.created_at.isoformat()}"' in started.group(1)
    await ws.disconnect()


async def test_streamed_tokens_are_appended_escaped(search, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    await sync_to_async(live.token)(search.pk, "trial 3", "\n<script>alert(1)</script> & ok")
    frame = await ws.receive_from(timeout=WAIT)
    assert frame == (
        '<pre id="proposal-stream" hx-swap-oob="beforeend">\n'
        "\n&lt;script&gt;alert(1)&lt;/script&gt; &amp; ok</pre>"
    )
    await ws.disconnect()


# -- what the browser may send -----------------------------------------------------------------


async def test_since_returns_the_rows_changed_after_it(search, engineer_cookie):
    untouched = await db(propose)(search, 1)
    changed = await db(propose)(search, 2)
    ws, _ = await connected(search.pk, engineer_cookie)
    since = timezone.now() - timedelta(milliseconds=1)
    # Changes whose events Redis "dropped": only the database knows.
    await db(services.mark_trial_queued)(trial=changed, job_id="job-2")
    new = await db(propose)(search, 3)
    await ws.send_to(
        text_data=json.dumps({"since": since.isoformat(), "HEADERS": {"HX-Request": "true"}})
    )
    status = await ws.receive_from(timeout=WAIT)
    assert 'id="search-status"' in status
    replaced = await ws.receive_from(timeout=WAIT)
    assert row_ids(replaced) == [changed.pk]
    assert replaced.startswith(f'<tr hx-swap-oob="true" id="trial-{changed.pk}"')
    assert "queued" in replaced.lower()
    inserted = await ws.receive_from(timeout=WAIT)
    assert inserted.startswith(f'<tbody id="trial-rows" hx-swap-oob="afterbegin:{NEWEST}">')
    assert row_ids(inserted) == [new.pk]
    assert untouched.pk not in row_ids(replaced + inserted)
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_flood_of_changes_since_sends_the_newest_page_whole(
    search, engineer_cookie, monkeypatch
):
    monkeypatch.setattr(consumers, "SINCE_LIMIT", 2)
    ws, _ = await connected(search.pk, engineer_cookie)
    since = timezone.now() - timedelta(milliseconds=1)
    trials = [await db(propose)(search, i) for i in range(3)]
    await ws.send_to(text_data=json.dumps({"since": since.isoformat()}))
    await ws.receive_from(timeout=WAIT)  # status
    rows = await ws.receive_from(timeout=WAIT)
    assert rows.startswith(f'<tbody id="trial-rows" hx-swap-oob="innerHTML:{NEWEST}">')
    assert row_ids(rows) == [t.pk for t in reversed(trials)]
    await ws.disconnect()


GARBAGE = [
    ("not json at all", "bad_json"),
    ("{", "bad_json"),
    ("[" * 30_000 + "]" * 30_000, "bad_json"),  # under 64 KiB, too deep to parse
    ("[1, 2]", "bad_message"),
    ('"since"', "bad_message"),
    ("null", "bad_message"),
    ("{}", "bad_message"),
    ('{"evil": 1}', "bad_message"),
    ('{"since": "2026-01-01T00:00:00Z", "page": 1}', "bad_message"),
    ('{"since": 5}', "bad_since"),
    ('{"since": null}', "bad_since"),
    ('{"since": ["2026-01-01"]}', "bad_since"),
    ('{"since": "yesterday"}', "bad_since"),
    ('{"since": "2026-13-45T99:00:00"}', "bad_since"),
    ('{"since": "' + "9" * 1000 + '"}', "bad_since"),
    # valid dates whose UTC time falls off the calendar
    ('{"since": "0001-01-01T00:00:00+14:00"}', "bad_since"),
    ('{"since": "9999-12-31T23:59:59-14:00"}', "bad_since"),
]


@pytest.mark.parametrize(("frame", "error"), GARBAGE)
async def test_a_bad_message_gets_an_error_frame_and_the_socket_stays_usable(
    search, engineer_cookie, frame, error
):
    ws, _ = await connected(search.pk, engineer_cookie)
    await ws.send_to(text_data=frame)
    reply = await ws.receive_from(timeout=WAIT)
    assert reply.startswith('<div id="live-error" hx-swap-oob="true" role="alert"')
    assert f'data-error="{error}"' in reply
    # Still serving: a good message is answered.
    await ws.send_to(text_data=json.dumps({"since": timezone.now().isoformat()}))
    assert 'id="search-status"' in await ws.receive_from(timeout=WAIT)
    await ws.disconnect()


async def test_a_binary_frame_gets_an_error_frame(search, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    await ws.send_to(bytes_data=b"\x00\xff" * 10)
    assert 'data-error="binary"' in await ws.receive_from(timeout=WAIT)
    await ws.disconnect()


async def test_an_oversized_frame_closes_the_socket_cleanly(search, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    await ws.send_to(text_data=json.dumps({"since": "x" * (64 * 1024)}))
    assert 'data-error="too_big"' in await ws.receive_from(timeout=WAIT)
    assert await closed_with(ws) == 1009
    await ws.disconnect()


async def test_a_client_that_keeps_sending_garbage_is_closed(search, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    for _ in range(consumers.MAX_BAD_FRAMES):
        await ws.send_to(text_data="garbage")
        assert 'data-error="bad_json"' in await ws.receive_from(timeout=WAIT)
    assert await closed_with(ws) == 1008
    await ws.disconnect()


# -- the stream ends when access does ----------------------------------------------------------


async def test_a_deleted_search_ends_the_stream_with_4404(search, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    search_id = search.pk
    await db(_delete_search)(search_id)
    await get_channel_layer().group_send(
        live.group_name(search_id),
        {"type": "search.event", "kind": "search", "search_id": search_id, "status": "x"},
    )
    assert await closed_with(ws) == 4404
    await ws.disconnect()


def _delete_search(search_id: int) -> None:
    Trial.objects.filter(search_id=search_id).delete()
    Search.objects.filter(pk=search_id).delete()
