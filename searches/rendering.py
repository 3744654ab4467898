"""Turning user- and LLM-written text into HTML that is safe to embed.

Everything here escapes its input: markdown with raw HTML disabled (markdown-it also refuses
`javascript:` links), source and diffs through pygments. These are the only places the app
marks HTML safe; templates never use `|safe` on anything a person or a model wrote.
"""

from __future__ import annotations

import difflib

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


def pygments_css() -> str:
    """The stylesheet for highlighted blocks (written to static/css/pygments.css)."""
    return _formatter().get_style_defs(f".{CSS_CLASS}")
