"""The live view's fan-out: a row is rendered once per change (by `searches.live`, from the
database) and carried in the group message; each socket only checks its user's access and
forwards it. Real ASGI stack, real channels_redis layer."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session
from django.middleware.csrf import _does_token_match
from django.test import Client
from django.urls import reverse

from autoweb.asgi import application
from core.roles import ENGINEERS
from searches import consumers, live, services
from searches.models import Trial
from tests.web.domain import propose
from tests.web.pages import HOSTILE, HOSTILE_RAW
from tests.web.test_live_consumer import (  # noqa: F401 (fixtures)
    ORIGIN,
    WAIT,
    anyio_backend,
    channel_layer,
    closed_with,
    connected,
    login_cookie,
    row_ids,
    socket,
)

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

db = database_sync_to_async
PROBE = "live-fanout-probe"


@pytest.fixture
def engineer_cookie(engineer) -> str:
    return login_cookie(engineer)


async def probe(search_id: int) -> str:
    """A plain channel in the search's group: it sees the group's messages as sent."""
    name = f"{PROBE}.{search_id}"
    await get_channel_layer().group_add(live.group_name(search_id), name)
    return name


def rows_message(search_id: int, *rows: dict) -> dict:
    return {"type": "search.event", "kind": "rows", "search_id": search_id, "rows": list(rows)}


def fresh(trial: Trial) -> Trial:
    return Trial.objects.get(pk=trial.pk)


# -- (a) the group message carries the rendered row ---------------------------------------------


async def test_a_trial_change_reaches_the_group_as_one_rendered_row(search):
    trial = await db(propose)(search, 1, rationale="wider blocks")
    channel = await probe(search.pk)
    await sync_to_async(live.trial_changed)(trial)
    message = await get_channel_layer().receive(channel)
    assert message["kind"] == "rows"
    assert message["search_id"] == search.pk
    (row,) = message["rows"]
    assert (row["trial_id"], row["index"], row["status"]) == (trial.pk, trial.index, "proposed")
    assert row["html"] == live.render_row(await db(fresh)(trial))
    assert "wider blocks" in row["html"]


async def test_the_socket_forwards_the_messages_html_without_rendering_it_again(
    search, engineer_cookie
):
    trial = await db(propose)(search, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    # Not what the database would render: proof that the consumer does not re-read per client.
    html = f'<tr id="trial-{trial.pk}" class="marker"><td>from the message</td></tr>'
    oob = html.replace("<tr ", '<tr hx-swap-oob="true" ', 1)
    row = {"trial_id": trial.pk, "index": trial.index, "status": "kept", "html": html}
    await get_channel_layer().group_send(live.group_name(search.pk), rows_message(search.pk, row))
    frame = await ws.receive_from(timeout=WAIT)
    assert frame == oob
    assert oob.startswith(f'<tr hx-swap-oob="true" id="trial-{trial.pk}" class="marker">')
    await ws.disconnect()


async def test_a_new_row_is_inserted_and_each_version_in_a_message_is_forwarded_in_order(
    search, engineer_cookie
):
    ws, _ = await connected(search.pk, engineer_cookie)
    trial = await db(propose)(search, 1)
    queued = await db(services.mark_trial_queued)(trial=trial, job_id="job-1")
    await sync_to_async(live.trials_changed)(search.pk, [(trial, None), (queued, None)])
    inserted = await ws.receive_from(timeout=WAIT)
    assert inserted.startswith(
        f'<tbody id="trial-rows" hx-swap-oob="afterbegin:{consumers.NEWEST}">'
    )
    assert row_ids(inserted) == [trial.pk] and "Proposed" in inserted
    replaced = await ws.receive_from(timeout=WAIT)
    assert replaced.startswith(f'<tr hx-swap-oob="true" id="trial-{trial.pk}"')
    assert "Queued" in replaced
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


@pytest.mark.parametrize(
    "row",
    [
        {"html": "<script>alert(1)</script>"},  # not a row at all
        {"html": '<tr id="trial-999999" class="x"></tr>'},  # another trial's row
        {"html": None},
        {"trial_id": True},
        {"trial_id": "1"},
        {"index": None},
    ],
)
async def test_a_row_that_is_not_the_named_trials_partial_is_not_forwarded(
    search, engineer_cookie, row
):
    trial = await db(propose)(search, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    good = {"trial_id": trial.pk, "index": trial.index, "status": "proposed"}
    good["html"] = f'<tr id="trial-{trial.pk}" class="x"></tr>'
    await get_channel_layer().group_send(
        live.group_name(search.pk), rows_message(search.pk, {**good, **row})
    )
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


async def test_rows_of_another_search_are_not_forwarded(search, engineer_cookie):
    trial = await db(propose)(search, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    html = f'<tr id="trial-{trial.pk}" class="x"></tr>'
    row = {"trial_id": trial.pk, "index": trial.index, "status": "kept", "html": html}
    await get_channel_layer().group_send(
        live.group_name(search.pk), rows_message(search.pk + 1, row)
    )
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


async def test_a_user_without_access_gets_no_rendered_row(search, outsider):
    ws = socket(search.pk, await db(login_cookie)(outsider))
    assert (await ws.connect(timeout=WAIT))[0]
    assert await closed_with(ws) == 4403
    trial = await db(propose)(search, 1)
    await sync_to_async(live.trial_changed)(trial)
    html = f'<tr id="trial-{trial.pk}" class="x"></tr>'
    row = {"trial_id": trial.pk, "index": trial.index, "status": "kept", "html": html}
    await get_channel_layer().group_send(live.group_name(search.pk), rows_message(search.pk, row))
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


async def test_an_idle_socket_outlives_the_layers_blocking_wait(search, engineer_cookie):
    """A socket waits for messages with a blocking pop of `brpop_timeout` seconds; a Redis read
    timeout no longer than that (redis-py 8's default) tore every idle socket down with 1011."""
    trial = await db(propose)(search, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    assert await ws.receive_nothing(timeout=RedisChannelLayer.brpop_timeout + 1.5)
    await sync_to_async(live.trial_changed)(trial)
    assert row_ids(await ws.receive_from(timeout=WAIT)) == [trial.pk]
    await ws.disconnect()


def _revoke_role(user) -> None:
    user.groups.remove(Group.objects.get(name=ENGINEERS))


def _deactivate(user) -> None:
    type(user).objects.filter(pk=user.pk).update(is_active=False)


def _log_out(user) -> None:
    Session.objects.all().delete()


@pytest.mark.parametrize(
    ("revoke", "code"), [(_revoke_role, 4403), (_deactivate, 4401), (_log_out, 4401)]
)
async def test_access_revoked_while_watching_ends_the_stream_at_the_next_recheck(
    search, engineer, engineer_cookie, monkeypatch, revoke, code
):
    monkeypatch.setattr(consumers, "ACCESS_RECHECK_S", 0.0)  # every push re-checks
    trial = await db(propose)(search, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    await sync_to_async(live.trial_changed)(trial)
    assert row_ids(await ws.receive_from(timeout=WAIT)) == [trial.pk]  # re-checked: allowed

    await db(revoke)(engineer)
    await sync_to_async(live.trial_changed)(trial)
    assert await closed_with(ws) == code  # closed before the row: nothing forwarded
    await ws.disconnect()


async def test_access_is_cached_between_rechecks(search, engineer_cookie, monkeypatch):
    """The bound the module docstring states: no database work per push inside the window."""
    trial = await db(propose)(search, 1)
    ws, _ = await connected(search.pk, engineer_cookie)
    calls = []
    monkeypatch.setattr(consumers, "_recheck", lambda *a: calls.append(a) or (None, 4403))
    html = f'<tr id="trial-{trial.pk}" class="x"></tr>'
    row = {"trial_id": trial.pk, "index": trial.index, "status": "kept", "html": html}
    for _ in range(3):
        await get_channel_layer().group_send(
            live.group_name(search.pk), rows_message(search.pk, row)
        )
        assert row_ids(await ws.receive_from(timeout=WAIT)) == [trial.pk]
    assert calls == []
    await ws.disconnect()


# -- (c) one source per fragment ------------------------------------------------------------------


def _hostile_trials(search) -> list[Trial]:
    proposed = propose(search, 1, rationale=HOSTILE)
    failed = propose(search, 2, rationale=HOSTILE)
    failed = services.reject_trial(trial=failed, failure="incorrect", reasons=[HOSTILE])
    return [proposed, failed]


def _htmx_rows(user, search_id: int) -> dict[int, str]:
    client = Client()
    client.force_login(user)
    response = client.get(
        reverse("searches:search", args=[search_id]),
        headers={"HX-Request": "true", "HX-Target": "trials"},
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="trials"')  # the partial, not the page
    return {
        int(m.group(1)): m.group(0)
        for m in re.finditer(r'<tr id="trial-(\d+)".*?</tr>', html, flags=re.S)
    }


async def test_a_pushed_row_is_the_htmx_endpoints_row_and_hostile_text_stays_inert(
    search, engineer, engineer_cookie
):
    trials = await db(_hostile_trials)(search)
    htmx_rows = await db(_htmx_rows)(engineer, search.pk)
    assert sorted(htmx_rows) == sorted(t.pk for t in trials)
    ws, _ = await connected(search.pk, engineer_cookie)
    for trial in trials:
        assert live.render_row(await db(fresh)(trial)) == htmx_rows[trial.pk]
        await sync_to_async(live.trial_changed)(trial)
        frame = await ws.receive_from(timeout=WAIT)
        assert frame.replace(' hx-swap-oob="true"', "", 1) == htmx_rows[trial.pk]
        for raw in HOSTILE_RAW:
            assert raw not in frame
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in frame
    await ws.disconnect()


def _htmx_status(user, search_id: int) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(
        reverse("searches:search", args=[search_id]),
        headers={"HX-Request": "true", "HX-Target": "search-status"},
    )
    assert response.status_code == 200
    return response.content.decode().strip()


def _tokens(html: str) -> list[str]:
    return re.findall(r'name="csrfmiddlewaretoken" value="([^"]*)"', html)


async def test_a_status_change_is_rendered_once_with_each_browsers_own_csrf_token(
    search, engineer, settings
):
    """The section in the group message is the htmx endpoint's partial; the socket puts in a
    token for its browser's CSRF cookie, so the pushed Pause/Stop forms post."""
    secret = "c" * 16 + "D" * 16
    cookie = await db(login_cookie)(engineer)
    cookies = f"{settings.SESSION_COOKIE_NAME}={cookie}; {settings.CSRF_COOKIE_NAME}={secret}"
    headers = [(b"origin", ORIGIN.encode()), (b"cookie", cookies.encode())]
    ws = WebsocketCommunicator(application, f"/ws/searches/{search.pk}/", headers=headers)
    assert (await ws.connect(timeout=WAIT))[0]
    await ws.receive_from(timeout=WAIT)  # the catch-up's status
    channel = await probe(search.pk)

    await sync_to_async(live.search_changed)(search)
    message = await get_channel_layer().receive(channel)
    assert message["kind"] == "search" and message["search_id"] == search.pk
    htmx = await db(_htmx_status)(engineer, search.pk)

    def normal(html: str) -> str:
        """Without the CSRF tokens, and the wall-clock minutes (rendered a moment apart)."""
        html = live.CSRF_FIELD.sub(r"\g<1>TOKEN\g<2>", html)
        return re.sub(r"(<dt>wall minutes</dt>\s*<dd>).*?(</dd>)", r"\1\2", html, flags=re.S)

    assert normal(message["html"]) == normal(htmx)
    assert len(_tokens(htmx)) == 2  # Pause and Stop: a running search

    frame = await ws.receive_from(timeout=WAIT)
    assert frame.startswith('<section hx-swap-oob="true" id="search-status"')
    # The section, then the page's live counts outside it (rendered once, in the message too).
    end = frame.rindex("</section>") + len("</section>")
    section, counts = frame[:end], frame[end:]
    assert normal(section.replace(' hx-swap-oob="true"', "", 1)) == normal(htmx)
    assert counts == "\n" + message["counts"] and 'id="trials-total"' in counts
    tokens = _tokens(frame)
    assert len(tokens) == 2 and all(_does_token_match(t, secret) for t in tokens)
    await ws.disconnect()
