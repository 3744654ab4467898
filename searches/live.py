"""Publishing to browsers: one channels group per search. Services and the orchestrator call
these; consumers only join groups and forward. A dropped message loses nothing: the page
catches up from the database when it (re)connects."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


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


def trial_changed(trial, event: dict[str, Any] | None = None) -> None:
    _send(
        trial.search_id,
        {"kind": "trial", "trial_id": trial.pk, "status": trial.status, "event": event or {}},
    )


def search_changed(search) -> None:
    _send(search.pk, {"kind": "search", "search_id": search.pk, "status": search.status})


def token(search_id: int, trial_hint: str, text: str) -> None:
    _send(search_id, {"kind": "tokens", "hint": trial_hint, "text": text})
