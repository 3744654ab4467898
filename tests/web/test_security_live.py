"""Websocket security through the real ASGI stack: every socket route needs a login, Origin is
checked, and only a user allowed to see a search ever joins its group."""

from __future__ import annotations

import re

import pytest
import redis
from channels.db import database_sync_to_async
from django.urls import URLPattern

from autoweb.routing import websocket_urlpatterns
from searches import live
from searches.models import Search, Trial
from tests.web.domain import propose
from tests.web.test_live_consumer import (  # noqa: F401 (fixtures)
    PREFIX,
    REDIS_URL,
    WAIT,
    anyio_backend,
    channel_layer,
    closed_with,
    connected,
    login_cookie,
    socket,
)

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

db = database_sync_to_async


@pytest.fixture
def engineer_cookie(engineer) -> str:
    return login_cookie(engineer)


def members(search_id: int) -> int:
    """Channels in the search's group, read from the channel layer's own Redis key."""
    key = f"{PREFIX}:group:{live.group_name(search_id)}"
    return redis.Redis.from_url(REDIS_URL).zcard(key)


def test_every_websocket_route_is_a_search_socket():
    """The checks below cover each route there is; a new route must be added to them."""
    routes = [str(p.pattern) for p in websocket_urlpatterns if isinstance(p, URLPattern)]
    assert routes == ["ws/searches/<int:search_id>/"]
    assert len(websocket_urlpatterns) == 1


async def test_an_anonymous_socket_never_joins_the_group(search):
    for pattern in websocket_urlpatterns:
        path = re.sub(r"<int:\w+>", str(search.pk), str(pattern.pattern))
        assert path == f"ws/searches/{search.pk}/"
        ws = socket(search.pk, cookie=None)
        assert (await ws.connect(timeout=WAIT))[0]
        assert await closed_with(ws) == 4401
        assert members(search.pk) == 0
        await ws.disconnect()


async def test_a_user_without_access_never_joins_the_group_and_gets_no_event(search, outsider):
    ws = socket(search.pk, await db(login_cookie)(outsider))
    assert (await ws.connect(timeout=WAIT))[0]
    assert await closed_with(ws) == 4403
    assert members(search.pk) == 0
    trial = await db(propose)(search, 1)
    await db(live.trial_changed)(trial)
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_an_engineer_joins_the_group_of_the_search_they_watch(search, engineer_cookie):
    ws, _ = await connected(search.pk, engineer_cookie)
    assert members(search.pk) == 1  # the two tests above could see a member: this one does
    await ws.disconnect()
    assert members(search.pk) == 0


@pytest.mark.parametrize(
    "origin", ["http://localhost", "https://localhost:8443", "http://127.0.0.1:8000"]
)
async def test_an_allowed_origin_is_accepted(search, engineer_cookie, origin):
    """ALLOWED_HOSTS as the ASGI application read it at import (the default's localhost)."""
    ws = socket(search.pk, engineer_cookie, origin=origin)
    ok, _ = await ws.connect(timeout=WAIT)
    assert ok
    assert 'id="search-status"' in await ws.receive_from(timeout=WAIT)
    await ws.disconnect()


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "null", "http://testserver.evil.example", "file://"]
)
async def test_a_foreign_origin_is_refused_before_the_session_is_read(
    search, engineer_cookie, origin
):
    ws = socket(search.pk, engineer_cookie, origin=origin)
    ok, _ = await ws.connect(timeout=WAIT)
    assert not ok
    assert members(search.pk) == 0
    await ws.disconnect()


def _state(search_id: int) -> tuple:
    search = Search.objects.values().get(pk=search_id)
    return search, list(Trial.objects.filter(search_id=search_id).order_by("pk").values())


GARBAGE = [
    "not json",
    "[1, 2, 3]",
    '{"since": {"$gt": ""}}',
    '{"action": "stop"}',
    '{"since": "2026-01-01T00:00:00", "status": "finished"}',
    '{"__proto__": {"x": 1}}',
    "{" * 5000,
    "\x00\x01",
]


async def test_garbage_frames_change_nothing_and_the_socket_keeps_serving(search, engineer_cookie):
    await db(propose)(search, 1)
    before = await db(_state)(search.pk)
    ws, _ = await connected(search.pk, engineer_cookie)
    for frame in GARBAGE:
        await ws.send_to(text_data=frame)
        reply = await ws.receive_from(timeout=WAIT)
        assert reply.startswith('<div id="live-error"'), (frame[:20], reply)
    await ws.send_to(text_data='{"since": "2000-01-01T00:00:00Z"}')
    assert 'id="search-status"' in await ws.receive_from(timeout=WAIT)
    assert await db(_state)(search.pk) == before
    await ws.disconnect()
