"""Pages of a list that a selector returns: the page asked for, clamped to a real one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def page_number(page: Any, total: int, per_page: int) -> int:
    """The page to show for a requested `page`: garbage or below 1 gives the first page, past
    the end the last one (as Django's `Paginator.get_page`), so a stale or hand-edited link still
    lands on a real page instead of an error."""
    try:
        number = max(int(page), 1)
    except (TypeError, ValueError, OverflowError):
        number = 1
    return min(number, max(1, math.ceil(total / per_page)))


@dataclass(kw_only=True)
class Page:
    """One page's numbers; a selector's page adds its rows (templates/core/partials/pager.html
    shows the links)."""

    page: int
    per_page: int
    total: int

    @property
    def num_pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def has_next(self) -> bool:
        return self.page < self.num_pages

    @property
    def has_previous(self) -> bool:
        return self.page > 1
