"""Turning user- and LLM-written text into HTML that is safe to embed.

Everything here escapes its input: markdown with raw HTML disabled (markdown-it also refuses
`javascript:` links), source and diffs through pygments. These are the only places the app
marks HTML safe; templates never use `|safe` on anything a person or a model wrote.

Side-by-side diffs (`source_diff`, shown by templates/core/partials/source_diff.html, used
by the search pages' trial comparison and the library's review page): difflib finds the
changed lines; pygments highlights (and so escapes) each source as a whole, and its HTML
formatter closes and reopens spans at every line end, so a highlighted source splits into
self-contained lines that can be laid out in two columns. No text is escaped by hand.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer, PythonLexer

# static/css/pygments.css is generated from this style (see `pygments_css`).
PYGMENTS_STYLE = "default"
CSS_CLASS = "highlight"

_markdown = MarkdownIt("commonmark", {"html": False})


def markdown(text: str | None) -> SafeString:
    """CommonMark to HTML; raw HTML in the text is shown as text, not interpreted."""
    return mark_safe(_markdown.render(text or ""))  # html disabled: raw HTML comes out escaped


def _formatter(**extra: object) -> HtmlFormatter:
    return HtmlFormatter(cssclass=CSS_CLASS, style=PYGMENTS_STYLE, **extra)


def python(source: str | None) -> SafeString:
    """Python source, highlighted, with line numbers."""
    html = highlight(source or "", PythonLexer(), _formatter(linenos="table"))
    return mark_safe(html)  # pygments escapes every token


def unified_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=old_name,
        tofile=new_name,
    )
    # A file without a final newline would glue its last line to the next diff line.
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def diff(old: str, new: str, old_name: str, new_name: str) -> SafeString:
    """The unified diff from `old` to `new`, highlighted; empty when they are the same."""
    text = unified_diff(old, new, old_name, new_name)
    if not text:
        return mark_safe("")
    return mark_safe(highlight(text, DiffLexer(), _formatter()))  # pygments escapes every token


@dataclass
class DiffRow:
    tag: str  # equal, replace, delete, insert, or skip (an elided unchanged run)
    old_no: int | None
    old_html: SafeString
    new_no: int | None
    new_html: SafeString


@dataclass
class SourceDiff:
    old_name: str
    new_name: str
    rows: list[DiffRow]
    unified: SafeString
    changed: bool


def _lines(source: str) -> list[SafeString]:
    if not source:
        return []
    lexer = PythonLexer(stripnl=False, ensurenl=True)
    html = highlight(source, lexer, HtmlFormatter(nowrap=True))
    lines = html.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [mark_safe(line) for line in lines]  # pygments escaped every token


def side_by_side(old: str, new: str, context: int | None = 3) -> list[DiffRow]:
    """Rows of the two sources aligned; unchanged runs longer than 2*context are elided
    (a row with tag "skip")."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    old_html, new_html = _lines(old), _lines(new)
    # pygments and splitlines agree on line count for Python source; pad defensively.
    old_html += [mark_safe("")] * (len(old_lines) - len(old_html))
    new_html += [mark_safe("")] * (len(new_lines) - len(new_html))
    blank = mark_safe("")
    rows: list[DiffRow] = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    groups = (
        matcher.get_grouped_opcodes(context) if context is not None else [matcher.get_opcodes()]
    )
    for g, group in enumerate(groups):
        if g and context is not None:
            rows.append(DiffRow("skip", None, blank, None, blank))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                    rows.append(DiffRow("equal", i + 1, old_html[i], j + 1, new_html[j]))
                continue
            for k in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + k, j1 + k
                rows.append(
                    DiffRow(
                        tag,
                        i + 1 if i < i2 else None,
                        old_html[i] if i < i2 else blank,
                        j + 1 if j < j2 else None,
                        new_html[j] if j < j2 else blank,
                    )
                )
    return rows


def source_diff(old: str, new: str, old_name: str, new_name: str) -> SourceDiff:
    """Both views of the change from `old` to `new`: side by side and unified."""
    return SourceDiff(
        old_name=old_name,
        new_name=new_name,
        rows=side_by_side(old, new),
        unified=diff(old, new, old_name, new_name),
        changed=old != new,
    )


def pygments_css() -> str:
    """The stylesheet for highlighted blocks (written to static/css/pygments.css)."""
    return _formatter().get_style_defs(f".{CSS_CLASS}")
