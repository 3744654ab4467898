"""The live view of one search over a websocket: htmx out-of-band fragments, rendered from the DB.

Protocol (server -> browser): every text frame is HTML for htmx's ws extension, one kind of
fragment per frame (table rows and sections cannot share one parse):

- ``<section id="search-status" hx-swap-oob="true">`` -- the status partial
  (templates/searches/partials/search_status.html, context ``search``), followed in the same
  frame by ``<span id="trials-total" hx-swap-oob="true">`` and
  ``<span id="search-started" hx-swap-oob="true">`` (the trial table's count and the intro's
  "started ... ago": `live.COUNTS_TEMPLATES`);
- ``<tr id="trial-N" hx-swap-oob="true">`` rows -- rows the page already shows, or rows of an
  older page (the browser may have paged there), replaced in place
  (templates/searches/partials/trial_row.html, context ``trial`` and ``progress``: the worker's
  ``{"phase", "shape", "of"}`` while it matches the row's status, else None);
- ``<tbody id="trial-rows" hx-swap-oob="afterbegin:NEWEST">`` rows -- trials new to the page,
  newest first;
- ``<tbody id="trial-rows" hx-swap-oob="innerHTML:NEWEST">`` rows -- the newest page of trials,
  whole (not sent while the search has no trial: the page's placeholder row stays);

where NEWEST selects ``#trial-rows`` only on the newest page: its ``data-page`` is "1" or absent.
Paging with htmx keeps the socket, so a page of older trials must not take inserts.
- ``<pre id="proposal-stream" hx-swap-oob="beforeend">`` text -- LLM tokens, escaped;
- ``<div id="live-error" hx-swap-oob="true" role="alert" data-error="CODE">`` -- a refused message.

Rows and the status section are rendered once per change by `searches.live` and arrive in the
group message as HTML (the same for every viewer); this consumer checks its user's access,
decides per connection whether a row is replaced or inserted, puts its browser's CSRF token into
the status section's forms, and forwards them. The channel layer is trusted
for that reason: only the web and orchestrator processes may write to it (docs/deploy.md, the
Redis ACL keeps GPU hosts off it).

Access is checked in full on connect, then cached per connection: it is checked again (the
session, the user, its roles and the search, all read afresh) before the first push that comes
more than ACCESS_RECHECK_S after the last check. A revoked role, a deactivated user, a
logged-out session or a deleted search therefore ends the stream (4403 / 4401 / 4404) at the
first push after the re-check is due, i.e. within ACCESS_RECHECK_S of the change (plus the time
to the next push); until then such a socket may still get rows it got before. A status change
re-reads the search for its section, so a deleted search ends the stream at once.

Browser -> server: only ``{"since": "<ISO 8601 timestamp>"}`` (htmx's ws-send adds a ``HEADERS``
object, which is ignored): the rows changed since then come back. Anything else gets an error
frame; a frame over 64 KiB, or too many bad frames, closes the socket (1009 / 1008).

Close codes: 4401 not logged in, 4403 not allowed to see searches, 4404 no such search (a
consumer that fails, e.g. Redis unreachable, is closed by daphne with 1011). htmx's ws extension
retries 1006/1011/1012/1013 with backoff and gives up on the others, so a refusal is final.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import escape

from searches import live, selectors
from searches.models import Search, Trial

log = logging.getLogger(__name__)

ROW_TEMPLATE = live.ROW_TEMPLATE
STATUS_TEMPLATE = live.STATUS_TEMPLATE
# Where inserts and the catch-up go: the rows of the newest page only (see the module docstring).
NEWEST = "#trial-rows[data-page='1'],#trial-rows:not([data-page])"

# The newest trials, as the search page's first page shows them.
CATCH_UP_ROWS = 50
# More changed rows than this since a client's timestamp: send the newest page whole instead.
SINCE_LIMIT = 200
MAX_FRAME_BYTES = 64 * 1024
MAX_BAD_FRAMES = 10
MAX_TOKEN_CHARS = 8 * 1024
# Seconds a connection's access check is trusted before a push checks it again (each connection
# waits between half and all of it, so sockets opened together do not re-check together).
ACCESS_RECHECK_S = 10.0

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009

_ROW_DEFER = live.ROW_DEFER
_CSRF_SECRET = re.compile(r"[A-Za-z0-9]{32}")


@dataclass
class Shown:
    """What this connection believes the page holds: rows it may replace, and the oldest trial
    index of the newest page (a trial at or below it belongs to an older page: not inserted)."""

    ids: set[int] = field(default_factory=set)
    floor: int = 0


@dataclass
class Frames:
    """The frames one step produces, in the order they are sent."""

    texts: list[str] = field(default_factory=list)
    close_code: int | None = None


class SearchConsumer(AsyncWebsocketConsumer):
    """One browser watching one search.

    The database is the truth: rows and the status section arrive rendered from it (by
    `searches.live`, once for the whole group); a bare hint is re-read and rendered here. A
    message that Redis drops therefore costs nothing that a later event or a reconnect does not
    repair: on (re)connect the client gets the search status and the newest page of trials from
    the database, whole, and a client that keeps a timestamp can send ``{"since": ...}`` to get
    every row changed after it.

    The socket joins the search's group only after the access check, and before reading the
    catch-up, so no event falls between the snapshot and the stream. Consumers only join groups
    and forward; publishing is `searches.live`'s job.
    """

    search_id: int
    group: str | None = None
    access_until = 0.0  # monotonic time until which the last access check is trusted
    csrf_token = ""

    async def connect(self) -> None:
        self.search_id = int(self.scope["url_route"]["kwargs"]["search_id"])
        self.shown = Shown()
        self.bad_frames = 0
        self.closing = False
        # Accept, then close with a code: a refused handshake reaches the browser as 1006,
        # which htmx's ws extension retries forever.
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self._close(CLOSE_UNAUTHENTICATED, "log in to watch this search")
            return
        code = await database_sync_to_async(_access)(user, self.search_id)
        if code is not None:
            await self._close(code)
            return
        self._trust_access()
        # For the forms of status sections rendered once for everyone (see `_status_frame`).
        self.csrf_token = get_token(self._view().request())
        # Redis unreachable: this raises (as does the consumer's own channel receive), daphne
        # closes with 1011, htmx reconnects with backoff and the catch-up fills the gap.
        self.group = live.group_name(self.search_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self._send(await self._step(_catch_up))

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            try:
                await self.channel_layer.group_discard(self.group, self.channel_name)
            except Exception:  # the group entry expires by itself
                log.debug("live view of search %s: group_discard failed", self.search_id)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closing:
            return
        if text_data is None:
            await self._refuse("binary", "Binary frames are not accepted.")
            return
        if len(text_data) > MAX_FRAME_BYTES or len(text_data.encode("utf-8")) > MAX_FRAME_BYTES:
            await self.send(text_data=_error("too_big", "A message may be at most 64 KiB."))
            await self._close(CLOSE_TOO_BIG, "message too big")
            return
        since, problem = _parse_since(text_data)
        if problem is not None:
            await self._refuse(*problem)
            return
        await self._send(await self._step(_since, since))

    async def search_event(self, event: dict[str, Any]) -> None:
        """A message from `searches.live` (see there): forward rendered rows, render the rest."""
        if self.closing:  # closed by us; the group is left when the server confirms
            return
        if not await self._allowed():
            return
        kind = event.get("kind")
        if kind == "search":
            html = event.get("html")
            if html is None:  # a bare hint: re-read and render here
                await self._send(await self._step(_status_only))
            elif event.get("search_id") == self.search_id:
                text = _status_frame(html, self.csrf_token, event.get("counts"))
                if text is not None:
                    await self.send(text_data=text)
        elif kind == "rows":
            if event.get("search_id") == self.search_id:
                for text in _forward_rows(self.shown, event.get("rows")):
                    await self.send(text_data=text)
        elif kind == "tokens":
            text = event.get("text")
            if isinstance(text, str) and text:
                await self.send(text_data=_tokens(text))
        elif kind == "trial":  # a bare hint: re-read and render here
            trial_id = event.get("trial_id")
            if isinstance(trial_id, int) and not isinstance(trial_id, bool):
                await self._send(await self._step(_trial_changed, trial_id, event.get("event")))

    # -- access -------------------------------------------------------------------------------

    def _trust_access(self) -> None:
        self.access_until = time.monotonic() + ACCESS_RECHECK_S * random.uniform(0.5, 1.0)

    async def _allowed(self) -> bool:
        """Whether this user may still watch; re-checked from the database once the last check
        is older than ACCESS_RECHECK_S (closes the socket when not)."""
        if time.monotonic() < self.access_until:
            return True
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        user, code = await database_sync_to_async(_recheck)(key, self.search_id)
        if code is not None:
            await self._close(code)
            return False
        self.scope["user"] = user  # fresh roles for the partials rendered here
        # Also renews the group entry, which channels-redis expires after group_expiry.
        await self.channel_layer.group_add(self.group, self.channel_name)
        self._trust_access()
        return True

    # -- helpers --------------------------------------------------------------------------------

    async def _step(self, fn: Any, *args: Any) -> Frames:
        return await database_sync_to_async(fn)(self._view(), *args)

    def _view(self) -> View:
        return View(
            user=self.scope["user"],
            search_id=self.search_id,
            shown=self.shown,
            cookies=self.scope.get("cookies") or {},
        )

    async def _send(self, frames: Frames) -> None:
        for text in frames.texts:
            await self.send(text_data=text)
        if frames.close_code is not None:
            await self._close(frames.close_code)

    async def _refuse(self, code: str, message: str) -> None:
        self.bad_frames += 1
        await self.send(text_data=_error(code, message))
        if self.bad_frames >= MAX_BAD_FRAMES:
            await self._close(CLOSE_POLICY, "too many bad messages")

    async def _close(self, code: int, reason: str | None = None) -> None:
        self.closing = True
        await self.close(code=code, reason=reason or _CLOSE_REASONS.get(code))


_CLOSE_REASONS = {
    CLOSE_UNAUTHENTICATED: "log in to watch this search",
    CLOSE_FORBIDDEN: "not allowed to see searches",
    CLOSE_NOT_FOUND: "no such search",
}


def _recheck(session_key: str | None, search_id: int) -> tuple[Any, int | None]:
    """The session's user read afresh (as a request would: a logged-out session, a changed
    password or a deactivated user is anonymous), and the close code if it may not watch."""
    user: Any = AnonymousUser()
    if session_key:
        request = HttpRequest()
        request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        user = auth.get_user(request)
    if not user.is_authenticated:
        return user, CLOSE_UNAUTHENTICATED
    return user, _access(user, search_id)


def _access(user: Any, search_id: int) -> int | None:
    """None when `user` may watch the search; otherwise the close code."""
    try:
        selectors.search_for_user(user, search_id)
    except PermissionDenied:
        return CLOSE_FORBIDDEN
    except Http404:
        return CLOSE_NOT_FOUND
    return None


def _parse_since(text: str) -> tuple[datetime | None, tuple[str, str] | None]:
    """The timestamp of a ``{"since": ...}`` message, or (None, (error code, message))."""
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return None, ("bad_json", "Messages must be JSON.")
    if not isinstance(message, dict):
        return None, ("bad_message", 'Send {"since": "<ISO 8601 timestamp>"}.')
    unknown = sorted(str(k) for k in message if k not in ("since", "HEADERS"))
    if unknown or "since" not in message:
        names = ", ".join(unknown)[:200] or "none"
        return None, ("bad_message", f'Only "since" is accepted (unknown fields: {names}).')
    raw = message["since"]
    if not isinstance(raw, str) or len(raw) > 64:
        return None, ("bad_since", '"since" must be an ISO 8601 timestamp string.')
    try:
        since = parse_datetime(raw.strip())
    except ValueError:
        since = None
    if since is None:
        return None, ("bad_since", '"since" must be an ISO 8601 timestamp string.')
    try:
        if timezone.is_naive(since):
            since = timezone.make_aware(since, timezone.get_default_timezone())
        since.astimezone(UTC)  # a date at the calendar's edge may have no UTC time
    except (OverflowError, ValueError):
        return None, ("bad_since", '"since" is outside the range of dates.')
    return since, None


# -- rendering (sync: runs in a database thread) ----------------------------------------------


@dataclass
class View:
    """One connection's state, handed to the sync steps below."""

    user: Any
    search_id: int
    shown: Shown
    cookies: dict[str, str]

    def search(self) -> Search:
        # Through the pages' own access rule on every step: a revoked role or a deleted search
        # ends the stream (Http404 / PermissionDenied are turned into close codes by `_guard`).
        return selectors.search_for_user(self.user, self.search_id)

    def request(self) -> HttpRequest:
        """A stand-in request, so partials render as for the page: `user`, and a `csrf_token`
        that matches the browser's cookie (its forms keep working after a push)."""
        request = HttpRequest()
        request.user = self.user
        request.method = "GET"
        cookie = self.cookies.get(settings.CSRF_COOKIE_NAME, "")
        if _CSRF_SECRET.fullmatch(cookie):
            request.META["CSRF_COOKIE"] = cookie
        return request


def _guard(fn: Any) -> Any:
    def step(view: View, *args: Any) -> Frames:
        try:
            return fn(view, *args)
        except PermissionDenied:
            return Frames(close_code=CLOSE_FORBIDDEN)
        except Http404:
            return Frames(close_code=CLOSE_NOT_FOUND)

    step.__name__ = fn.__name__
    return step


def _render(view: View, template: str, context: dict[str, Any]) -> str:
    return render_to_string(template, context, request=view.request()).strip()


def _oob(html: str, tag: str, value: str = "true") -> str:
    """`html` (a partial whose root is `<tag ...>`) marked as an out-of-band swap."""
    marked, n = re.subn(
        rf"^((?:\s|<!--.*?-->)*)<{tag}\b",
        rf'\1<{tag} hx-swap-oob="{value}"',
        html,
        count=1,
        flags=re.S,
    )
    if n != 1:
        raise ValueError(f"expected a partial whose root element is <{tag}>: {html[:80]!r}")
    return marked


def _status(view: View, search: Search) -> str:
    section = _oob(_render(view, STATUS_TEMPLATE, {"search": search}), "section")
    return f"{section}\n{live.render_counts(search)}"


def _row(view: View, search: Search, trial: Trial, progress: dict | None = None) -> str:
    trial.search = search  # the row may name its search: no query per row
    return live.render_row(trial, progress)


def _upsert(
    view: View, search: Search, trials: list[Trial], progress: dict | None = None
) -> Frames:
    """Rows the page shows are replaced; newer ones are inserted at the top, newest first."""
    frames = Frames()
    replaced, inserted = [], []
    for trial in trials:
        # An older page's row is replaced in place too: the browser may be showing that page
        # (paging swaps the rows, not the socket); where it is not, htmx finds no target.
        if trial.pk in view.shown.ids or trial.index <= view.shown.floor:
            replaced.append(_oob(_row(view, search, trial, progress), "tr"))
        elif trial.index > view.shown.floor:
            inserted.append(trial)
            view.shown.ids.add(trial.pk)
    if replaced:
        frames.texts.append("\n".join(replaced))
    if inserted:
        inserted.sort(key=lambda t: t.index, reverse=True)
        rows = "\n".join(_row(view, search, t, progress) for t in inserted)
        frames.texts.append(_inserted(rows))
    return frames


def _newest_page(view: View, search: Search) -> str | None:
    trials = selectors.trials_page(search, 1, per_page=CATCH_UP_ROWS).trials
    view.shown.ids = {t.pk for t in trials}
    view.shown.floor = trials[-1].index if len(trials) >= CATCH_UP_ROWS else 0
    if not trials:
        return None
    rows = "\n".join(_row(view, search, t) for t in trials)
    return f'<tbody id="trial-rows" hx-swap-oob="innerHTML:{NEWEST}">{rows}</tbody>'


@_guard
def _catch_up(view: View) -> Frames:
    search = view.search()
    frames = Frames(texts=[_status(view, search)])
    rows = _newest_page(view, search)
    if rows is not None:
        frames.texts.append(rows)
    return frames


@_guard
def _status_only(view: View) -> Frames:
    return Frames(texts=[_status(view, view.search())])


@_guard
def _trial_changed(view: View, trial_id: int, event: Any) -> Frames:
    search = view.search()
    trial = (
        Trial.objects.filter(pk=trial_id, search_id=search.pk).defer(*_ROW_DEFER).first()
    )  # a hint naming another search's trial finds nothing here
    if trial is None:
        return Frames()
    return _upsert(view, search, [trial], _progress(trial, event))


@_guard
def _since(view: View, since: datetime) -> Frames:
    search = view.search()
    frames = Frames(texts=[_status(view, search)])
    trials = selectors.trials_updated_since(search, since, limit=SINCE_LIMIT)
    if len(trials) >= SINCE_LIMIT:
        rows = _newest_page(view, search)
        frames.texts.extend([rows] if rows else [])
    else:
        frames.texts.extend(_upsert(view, search, trials).texts)
    return frames


_progress = live.progress


def _forward_rows(shown: Shown, rows: Any) -> list[str]:
    """Frames for rows rendered by `searches.live`, one per row version, in order: a row the
    page may show (this page's, or an older page's: the browser may have paged there) is
    replaced in place, a newer trial is inserted at the top of the newest page. No database."""
    frames: list[str] = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict):
            continue
        trial_id, index, html = row.get("trial_id"), row.get("index"), row.get("html")
        if not (_an_int(trial_id) and _an_int(index) and isinstance(html, str)):
            continue
        if not html.startswith(f'<tr id="trial-{trial_id}" '):
            continue  # not the row partial of the trial it names
        if trial_id in shown.ids or index <= shown.floor:
            frames.append(_oob(html, "tr"))
        else:
            shown.ids.add(trial_id)
            frames.append(_inserted(html))
    return frames


_COUNTS = re.compile(r'<span id="(trials-total|search-started)" [^>]*hx-swap-oob="true"')


def _status_frame(html: Any, csrf_token: str, counts: Any = None) -> str | None:
    """A status section rendered by `searches.live` for no one, with this browser's CSRF token
    in its forms (a token for the browser's own cookie, as a page would render it), and the
    live counts that came with it (kept only if they are the counts partials' spans)."""
    if not isinstance(html, str) or not html.startswith('<section id="search-status" '):
        return None
    text = _oob(live.CSRF_FIELD.sub(rf"\g<1>{csrf_token}\g<2>", html), "section")
    if isinstance(counts, str) and _COUNTS.match(counts):
        text += "\n" + counts
    return text


def _inserted(rows: str) -> str:
    return f'<tbody id="trial-rows" hx-swap-oob="afterbegin:{NEWEST}">{rows}</tbody>'


def _an_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tokens(text: str) -> str:
    # The parser drops one newline right after <pre>: lead with one so the text keeps its own.
    body = escape(text[:MAX_TOKEN_CHARS])
    return f'<pre id="proposal-stream" hx-swap-oob="beforeend">\n{body}</pre>'


def _error(code: str, message: str) -> str:
    return (
        f'<div id="live-error" hx-swap-oob="true" role="alert" data-error="{escape(code)}">'
        f"{escape(message)}</div>"
    )
