"""The HTML helpers the pages rely on for safety, and the number formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import rendering
from core.templatetags import autoweb_format as fmt

ROOT = Path(__file__).resolve().parents[2]


def test_markdown_renders_formatting_and_escapes_raw_html():
    html = rendering.markdown("# Title\n\n**bold** <b onclick=x()>raw</b>\n\n<script>x()</script>")
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html
    assert "<b onclick" not in html and "<script>" not in html
    assert "&lt;b onclick=x()&gt;raw&lt;/b&gt;" in html


@pytest.mark.parametrize(
    "link", ["javascript:alert(1)", "JaVaScRiPt:alert(1)", "vbscript:x", "data:text/html,x"]
)
def test_markdown_refuses_script_links(link):
    html = rendering.markdown(f"[click]({link})")
    assert "<a " not in html


def test_python_and_diff_escape_their_input():
    source = "x = '<script>alert(1)</script>'\n"
    assert "<script>" not in rendering.python(source)
    assert "&lt;script&gt;" in rendering.python(source)
    diff = rendering.diff("x = 1\n", source, "a", "b")
    assert "<script>" not in diff and "&lt;script&gt;" in diff


def test_a_diff_of_identical_sources_is_empty_and_a_missing_newline_is_kept_apart():
    assert rendering.diff("a\n", "a\n", "x", "y") == ""
    text = rendering.unified_diff("a\nb", "a\nc", "x", "y")
    assert "-b\n+c\n" in text


def test_the_checked_in_pygments_stylesheet_matches_the_formatter():
    css = (ROOT / "static/css/pygments.css").read_text()
    assert rendering.pygments_css() in css


@pytest.mark.parametrize(
    ("filter_", "value", "shown"),
    [
        (fmt.ms, 0.0675111, "0.06751 ms"),
        (fmt.ms, None, "—"),
        (fmt.ms, "NaN", "NaN"),
        (fmt.speedup, 1.3435, "1.34×"),
        (fmt.speedup, True, "—"),
        (fmt.pct, 0.1116, "11.2%"),
        (fmt.num, 4176.9, "4177"),
        (fmt.age, 7.2, "7 s"),
        (fmt.age, 3 * 3600 + 5, "3 h"),
        (fmt.age, None, "—"),
    ],
)
def test_number_formats(filter_, value, shown):
    assert filter_(value) == shown
