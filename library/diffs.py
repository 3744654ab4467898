"""Side-by-side and unified diffs of candidate sources for the review page.

The helpers live in `searches.rendering` (the search pages compare trials with them too, and
searches does not import library); this module keeps the names the library's views use.
"""

from __future__ import annotations

from searches.rendering import DiffRow as Row
from searches.rendering import SourceDiff as Diff
from searches.rendering import side_by_side
from searches.rendering import source_diff as diff

__all__ = ["Diff", "Row", "diff", "side_by_side"]
