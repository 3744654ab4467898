"""Helpers for the page tests: a real harness report, hostile text, many trials at once."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from searches import services
from searches.models import Search, Trial
from tests.web.domain import SOFTMAX_SEED, judge

ROOT = Path(__file__).resolve().parents[2]
# A report the harness wrote on the H200 (docs/benchmarks): the page must show every part of it.
H200_REPORT: dict[str, Any] = json.loads(
    (ROOT / "docs/benchmarks/h200/cli-softmax-seed-full.json").read_text()
)

HOSTILE = '<script>alert(1)</script> <img src=x onerror=alert(1)> <a hx-get="/x" hx-trigger="load">'
HOSTILE_RAW = ("<script>alert(1)</script>", "<img src=x onerror=alert(1)>", 'hx-get="/x"')


PAGE_SCRIPTS = ["/static/vendor/htmx-2.0.11.min.js", "/static/vendor/htmx-ext-ws-2.0.4.js"]
CHART_SCRIPTS = ["/static/vendor/plotly-4.1.1.min.js", "/static/js/charts.js"]
IDEA_FORM_SCRIPTS = ["/static/js/idea_form.js"]  # asks before submitting for an offline kind
CHART_SLOT = re.compile(r"/(charts/dashboard|charts/problems/[a-z0-9_]+|searches/\d+/charts)")


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def assert_inert(html: str) -> None:
    """No element or attribute that hostile text could have planted is live in `html`: the
    page's own scripts only, no <img>, no event handler, no htmx attribute aimed at /x."""
    parser = _Markup()
    parser.feed(html)
    # Chart data is JSON in <script type="application/json"> (escaped by json_script): not code.
    scripts = [
        attrs.get("src")
        for tag, attrs in parser.tags
        if tag == "script" and attrs.get("type") != "application/json"
    ]
    assert scripts in (
        PAGE_SCRIPTS,
        PAGE_SCRIPTS + CHART_SCRIPTS,
        PAGE_SCRIPTS + IDEA_FORM_SCRIPTS,
    ), scripts
    assert not [attrs for tag, attrs in parser.tags if tag == "img"]
    for tag, attrs in parser.tags:
        assert not [name for name in attrs if name.startswith("on")], (tag, attrs)
        assert attrs.get("hx-get") != "/x", (tag, attrs)
        if "hx-trigger" in attrs:  # only the page's own chart sections load themselves
            assert tag == "section" and CHART_SLOT.fullmatch(attrs.get("hx-get") or ""), attrs


def h200_report(**summary: Any) -> dict[str, Any]:
    report = copy.deepcopy(H200_REPORT)
    report["summary"].update(summary)
    return report


def knob_variant(block: int) -> str:
    """The softmax seed with one knob value changed: a diff of one line."""
    lines = SOFTMAX_SEED.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if "# tune:" in line:
            name = line.split("=", 1)[0].strip()
            rest = line.split("#", 1)[1]
            lines[i] = f"{name} = {block}  #{rest}"
            break
    return "".join(lines)


def bulk_trials(search: Search, n: int) -> None:
    """`n` judged trials in a few queries (recording 10,000 through services takes minutes)."""
    statuses = (Trial.Status.REVERTED, Trial.Status.FAILED, Trial.Status.KEPT)
    rows = []
    for i in range(1, n + 1):
        source = f"{SOFTMAX_SEED}\n# bulk {i}\n"
        status = statuses[i % 3]
        rows.append(
            Trial(
                search=search,
                index=i,
                source=source,
                source_sha256=hashlib.sha256(source.encode()).hexdigest(),
                proposer="tuner",
                rationale=f"bulk trial {i}",
                status=status,
                failure="incorrect" if status == Trial.Status.FAILED else None,
                reasons=["max abs error 0.3"] if status == Trial.Status.FAILED else ["slower"],
                geomean_ms=None if status == Trial.Status.FAILED else 0.05 + i * 1e-6,
                speedup_eager=None if status == Trial.Status.FAILED else 1.1,
                speedup_compiled=None if status == Trial.Status.FAILED else 1.3,
                report={"verdict": "accepted", "shapes": [{"label": "big" * 1000}]},
            )
        )
    Trial.objects.bulk_create(rows, batch_size=1000)
    Search.objects.filter(pk=search.pk).update(trials_total=n)


def judged(search: Search, source: str, report: dict, *, parent: Trial | None = None, **kw: Any):
    trial = services.record_proposal(
        search=search, source=source, parent=parent, proposer="tuner", **kw
    )
    return judge(trial, report, gpu_seconds=3.0)  # a screening win is confirmed, as it would be
