"""Publishing to browsers: one channels group per search. Services and the orchestrator call
these; consumers only check access and forward. A dropped message loses nothing: the page
catches up from the database when it (re)connects.

A trial's row is rendered here, once per change for the whole group, not once per watching
browser: the row partial is the same for every user allowed to see the search (it carries no
user, form or CSRF token), so the group message carries the HTML and each `SearchConsumer` only
checks its user's access and forwards it. It is the partial the search page's table includes
(`ROW_TEMPLATE`): one source per fragment. The status section (`STATUS_TEMPLATE`, the htmx
endpoint's partial) is rendered once too; its forms carry a CSRF token, which is the only part
that differs per viewer: each consumer puts in a token for its own browser's cookie.

Messages (``type`` "search.event"), by ``kind``:

- ``rows``: ``{"search_id", "rows": [{"trial_id", "index", "status", "html"}, ...]}``, in the
  order the changes happened; several versions of one row may follow each other (one per
  status transition);
- ``trial``: ``{"trial_id"}`` without HTML, a hint: the consumer re-reads and renders the row
  itself (kept for bare hints; nothing here sends one any more);
- ``search``: ``{"search_id", "status", "html", "counts"}``: the status section, and the page's
  other live facts about the search (``COUNTS_TEMPLATES``: the trial table's "N in all", the
  intro's "started ... ago") as out-of-band spans; without ``html``, a hint on which the
  consumer re-reads and renders them itself;
- ``tokens``: ``{"hint", "text"}``: streamed LLM text, escaped by the consumer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.http import HttpRequest
from django.template.loader import render_to_string

log = logging.getLogger(__name__)

ROW_TEMPLATE = "searches/partials/trial_row.html"
STATUS_TEMPLATE = "searches/partials/search_status.html"
# Facts about the search shown outside the status section, pushed with it (each partial's root
# is a <span> with an id; `oob` marks it as an out-of-band swap).
COUNTS_TEMPLATES = ("searches/partials/trials_total.html", "searches/partials/search_started.html")
# A status section's CSRF token fields; rendered for a placeholder secret, replaced per viewer.
CSRF_FIELD = re.compile(r'(<input type="hidden" name="csrfmiddlewaretoken" value=")[^"]*(")')
_PLACEHOLDER_SECRET = "0" * 32
# Columns a row never shows (as in selectors): a changed trial is re-read without them.
ROW_DEFER = ("source", "report", "prompt", "versions")


def group_name(search_id: int) -> str:
    return f"search-{search_id}"


def _send(search_id: int, payload: dict[str, Any]) -> None:
    try:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        async_to_sync(layer.group_send)(group_name(search_id), {"type": "search.event", **payload})
    except Exception as e:  # never let a lost live update break the loop
        log.debug("live update for search %s dropped: %s", search_id, e)


# -- rows ---------------------------------------------------------------------------------------


def render_row(trial: Any, progress: dict[str, Any] | None = None) -> str:
    """The trial's ``<tr>``, exactly as the search page's table (and its htmx partial) shows it."""
    return render_to_string(ROW_TEMPLATE, {"trial": trial, "progress": progress}).strip()


def progress(trial: Any, event: Any) -> dict[str, Any] | None:
    """The worker's progress (``verifying shape 3/8``) for the row, if it matches the DB's phase."""
    if not isinstance(event, dict) or event.get("phase") != trial.status:
        return None
    shape, of = event.get("shape"), event.get("of")
    shown: dict[str, Any] = {"phase": trial.status}
    if isinstance(shape, int) and isinstance(of, int) and 0 <= shape <= of:
        shown.update(shape=shape, of=of)
    return shown


def row(trial: Any, event: Any = None) -> dict[str, Any]:
    """One entry of a ``rows`` message: the rendered row and what a consumer needs to place it."""
    return {
        "trial_id": trial.pk,
        "index": trial.index,
        "status": trial.status,
        "html": render_row(trial, progress(trial, event)),
    }


def trials_changed(search_id: int, changes: Iterable[tuple[Any, Any]]) -> None:
    """Push these row versions ((trial, worker event or None), oldest first) in one message,
    once the current transaction commits. Each trial is rendered as given: the caller hands in
    the row as the database held it after each change, so no status transition is lost."""
    try:
        rows = [row(trial, event) for trial, event in changes]
    except Exception:  # a row that fails to render must not stop the loop; the DB has it
        log.exception("live rows for search %s not rendered", search_id)
        return
    if rows:
        transaction.on_commit(
            lambda: _send(search_id, {"kind": "rows", "search_id": search_id, "rows": rows})
        )


def trial_changed(trial: Any, event: dict[str, Any] | None = None) -> None:
    """Push the trial's row as the database holds it once the current transaction commits.

    Re-read rather than rendered from `trial`: callers may hold an instance older than the
    row (the database is the truth, the call only says that something changed)."""
    search_id, trial_id = trial.search_id, trial.pk

    def push() -> None:
        from searches.models import Trial

        try:
            fresh = Trial.objects.filter(pk=trial_id, search_id=search_id).defer(*ROW_DEFER).first()
        except Exception as e:
            log.debug("live update for trial %s dropped: %s", trial_id, e)
            return
        if fresh is not None:
            trials_changed(search_id, [(fresh, event)])

    transaction.on_commit(push)


# -- the status section ------------------------------------------------------------------------


def render_status(search: Any) -> str:
    """The status section as the htmx endpoint renders it, but for no one: its forms' CSRF
    tokens belong to a placeholder secret (`CSRF_FIELD` finds them; consumers replace them)."""
    request = HttpRequest()
    request.method = "GET"
    request.user = AnonymousUser()  # the section shows nothing per user but its CSRF tokens
    request.META["CSRF_COOKIE"] = _PLACEHOLDER_SECRET
    return render_to_string(STATUS_TEMPLATE, {"search": search}, request=request).strip()


def render_counts(search: Any) -> str:
    """The page's live facts outside the status section (`COUNTS_TEMPLATES`), as out-of-band
    spans, ready to follow the status section in one frame."""
    context = {"search": search, "oob": True}
    return "\n".join(render_to_string(name, context).strip() for name in COUNTS_TEMPLATES)


def search_changed(search: Any) -> None:
    """Push the search's status section, re-read and rendered once, after the commit."""
    search_id = search.pk

    def push() -> None:
        from searches.models import Search

        try:
            fresh = (
                Search.objects.select_related("idea", "created_by", "incumbent")
                .filter(pk=search_id)
                .first()
            )
            if fresh is None:
                return
            html = render_status(fresh)
            counts = render_counts(fresh)
        except Exception:  # a section that fails to render must not stop the loop
            log.exception("live status of search %s not rendered", search_id)
            return
        _send(
            search_id,
            {
                "kind": "search",
                "search_id": search_id,
                "status": fresh.status,
                "html": html,
                "counts": counts,
            },
        )

    transaction.on_commit(push)


def token(search_id: int, trial_hint: str, text: str) -> None:
    _send(search_id, {"kind": "tokens", "hint": trial_hint, "text": text})
