"""Side-by-side and unified diffs of candidate sources, highlighted by pygments.

difflib finds the changed lines; pygments highlights (and so escapes) each source as a whole,
and its HTML formatter closes and reopens spans at every line end, so a highlighted source
splits into self-contained lines that can be laid out in two columns. No text is escaped by
hand: every character reaches the page through pygments.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from django.utils.safestring import SafeString, mark_safe
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from searches import rendering


@dataclass
class Row:
    tag: str  # equal, replace, delete, insert
    old_no: int | None
    old_html: SafeString
    new_no: int | None
    new_html: SafeString


@dataclass
class Diff:
    old_name: str
    new_name: str
    rows: list[Row]
    unified: SafeString
    changed: bool


def _lines(source: str) -> list[SafeString]:
    if not source:
        return []
    html = highlight(source, PythonLexer(stripnl=False, ensurenl=True), HtmlFormatter(nowrap=True))
    lines = html.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [mark_safe(line) for line in lines]  # pygments escaped every token


def side_by_side(old: str, new: str, context: int | None = 3) -> list[Row]:
    """Rows of the two sources aligned; unchanged runs longer than 2*context are elided
    (a row with tag "skip")."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    old_html, new_html = _lines(old), _lines(new)
    # pygments and splitlines agree on line count for Python source; pad defensively.
    old_html += [mark_safe("")] * (len(old_lines) - len(old_html))
    new_html += [mark_safe("")] * (len(new_lines) - len(new_html))
    blank = mark_safe("")
    rows: list[Row] = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    groups = (
        matcher.get_grouped_opcodes(context) if context is not None else [matcher.get_opcodes()]
    )
    for g, group in enumerate(groups):
        if g and context is not None:
            rows.append(Row("skip", None, blank, None, blank))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                    rows.append(Row("equal", i + 1, old_html[i], j + 1, new_html[j]))
                continue
            for k in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + k, j1 + k
                rows.append(
                    Row(
                        tag,
                        i + 1 if i < i2 else None,
                        old_html[i] if i < i2 else blank,
                        j + 1 if j < j2 else None,
                        new_html[j] if j < j2 else blank,
                    )
                )
    return rows


def diff(old: str, new: str, old_name: str, new_name: str) -> Diff:
    return Diff(
        old_name=old_name,
        new_name=new_name,
        rows=side_by_side(old, new),
        unified=rendering.diff(old, new, old_name, new_name),
        changed=old != new,
    )
