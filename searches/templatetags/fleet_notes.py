"""What the pages say about the fleet: a search whose next trial waits for a worker of its kind
when none is online (`searches.fleet.search_waiting`). A tag, so every render of the status
section (the page, its htmx refresh, the live push) says the same."""

from __future__ import annotations

from django import template

from searches import fleet
from searches.models import Search

register = template.Library()


@register.simple_tag
def search_waiting(search: Search) -> str:
    return fleet.search_waiting(search) or ""
