"""Where a trial was measured, for every page that shows one: "imported from HOST (KIND)" for
a trial imported from another host (searches/imports.py), nothing for one measured here."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


def _origin(trial: Any) -> Any:
    # No row raises RelatedObjectDoesNotExist, an AttributeError: getattr's default applies.
    return getattr(trial, "imported", None) if trial is not None else None


@register.filter
def imported_from(trial: Any) -> str:
    origin = _origin(trial)
    return origin.label if origin is not None else ""


@register.inclusion_tag("searches/partials/imported_note.html")
def imported_note(trial: Any) -> dict[str, Any]:
    return {"origin": _origin(trial)}
