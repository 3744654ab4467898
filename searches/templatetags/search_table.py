"""`{% table_rows search as rows %}`: the per-shape table's rows wherever the partial renders
(the search page, its htmx and websocket updates, the review page), from one selector."""

from __future__ import annotations

from typing import Any

from django import template

from searches import selectors

register = template.Library()


@register.simple_tag
def table_rows(search: Any) -> list[dict[str, Any]]:
    return selectors.table_rows_of(search)
