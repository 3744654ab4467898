"""Notes for the agent: what reviewers and engineers say about a search reaches the next prompt.

The hook for the review app: on a veto, call
`add_note(search=trial.search, trial=trial, kind="veto", text=reason, author=reviewer)`.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from core.errors import DomainError
from searches.models import Search, SearchNote, Trial

MAX_NOTE = 4000


@transaction.atomic
def add_note(
    *,
    search: Search,
    text: str,
    kind: str = SearchNote.Kind.NOTE,
    trial: Trial | None = None,
    author: Any = None,
) -> SearchNote:
    errors: dict[str, list[str]] = {}
    text = text.strip() if isinstance(text, str) else ""
    if not text:
        errors["text"] = ["Write the note: the agent reads it in its next prompt."]
    elif len(text) > MAX_NOTE or "\x00" in text:
        errors["text"] = [f"A note is text of at most {MAX_NOTE:,} characters."]
    if kind not in SearchNote.Kind.values:
        errors["kind"] = [f"A note's kind is one of {', '.join(SearchNote.Kind.values)}."]
    if trial is not None and trial.search_id != search.pk:
        errors["trial"] = ["The trial belongs to another search."]
    if errors:
        raise DomainError(errors)
    return SearchNote.objects.create(
        search=search, trial=trial, kind=kind, text=text, author=author
    )
