"""Hostile text on the surfaces the other page tests do not reach: problem modules and their
directory names (AUTOWEB_PROBLEM_DIRS), context packs, notes for the agent, GPU kinds and worker
names from heartbeats, and the chart JSON of every page that embeds charts."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from django.urls import reverse

from kernels.queues import register
from searches import services
from searches.agent import notes, packs
from tests.web.domain import accepted, idea_kwargs, judge, propose
from tests.web.pages import HOSTILE, HOSTILE_RAW, assert_inert

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

# Short enough for the 64-character columns (a GPU kind), and a valid directory name.
SHORT_HOSTILE = "<img src=x onerror=alert(1)>"

PROBLEM = '''
import torch

SIGNATURE = "kernel(x)"  # a hostile one is refused at load: tests/kernels/test_bad_input.py
DESCRIPTION = {hostile!r}
DIMS = {{"M": (0, 0), "N": (0, 1)}}
RANKS = (2,)
SHAPES_FULL = [{{"M": 4, "N": 8}}]
SHAPES_SMOKE = [{{"M": 4, "N": 8}}]
DTYPES = {{"cuda": torch.float32, "interpret": torch.float32}}
TOLERANCE = {{torch.float32: {{"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5}}}}


def reference(x):
    """{hostile}"""
    return x * 2


def make_inputs(shape, dtype, device, generator):
    return (torch.randn(shape["M"], shape["N"], dtype=dtype, device=device, generator=generator),)


def flops(shape):
    return shape["M"] * shape["N"]


def bytes(shape, dtype):
    return 2 * shape["M"] * shape["N"] * 4
'''


class _Parts(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))


def assert_fragment_inert(html: str) -> None:
    """`assert_inert` for an htmx fragment (it has none of the page's own scripts)."""
    parser = _Parts()
    parser.feed(html)
    for tag, attrs in parser.tags:
        assert tag != "img", attrs
        assert tag != "script" or attrs.get("type") == "application/json", attrs
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        assert attrs.get("hx-get") != "/x", (tag, attrs)
    for raw in HOSTILE_RAW:
        assert raw not in html


def get(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


@pytest.fixture
def hostile_problems(tmp_path, monkeypatch):
    folder = tmp_path / SHORT_HOSTILE  # the directory's name is shown as the problem's path
    folder.mkdir()
    (folder / "hostile_problem.py").write_text(PROBLEM.format(hostile=HOSTILE))
    (folder / "raising_problem.py").write_text(f"raise RuntimeError({HOSTILE!r})\n")
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(folder))
    return folder


def test_hostile_problem_modules_and_directory_names_render_inert(
    engineer_client, hostile_problems
):
    for url in (
        reverse("searches:dashboard"),
        reverse("searches:problems"),
        reverse("searches:problem", args=["hostile_problem"]),
        reverse("searches:problem", args=["raising_problem"]),
        reverse("searches:idea_new"),
    ):
        html = get(engineer_client, url)
        assert_inert(html)
        # Tags never survive; the reference's source is highlighted text, where the quotes of
        # `hx-get="/x"` may stay (text between tags, not an attribute: assert_inert checked).
        for raw in (*HOSTILE_RAW[:2], SHORT_HOSTILE):
            assert raw not in html, (url, raw)
    listing = get(engineer_client, reverse("searches:problems"))
    assert 'id="problem-hostile_problem"' in listing  # it was shown, escaped
    assert "RuntimeError" in listing and "&lt;script&gt;" in listing  # the error too


def test_hostile_context_packs_render_inert(engineer_client, engineer):
    packs.save_pack(
        kind="model", name="evil-pack", title=f"T {HOSTILE}", body=f"# {HOSTILE}\n", author=engineer
    )
    packs.save_pack(
        kind="hardware", name="h200", title=HOSTILE, body=f"{HOSTILE}\n", author=engineer
    )
    for url in (
        reverse("searches:packs"),
        reverse("searches:pack", args=["model", "evil-pack"]),
        reverse("searches:pack", args=["hardware", "h200"]),
        reverse("searches:idea_new"),  # offers the model packs by name
    ):
        html = get(engineer_client, url)
        assert_inert(html)
        for raw in HOSTILE_RAW:
            assert raw not in html, (url, raw)
    page = get(engineer_client, reverse("searches:pack", args=["model", "evil-pack"]))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_hostile_notes_for_the_agent_render_inert(engineer_client, engineer):
    idea = services.create_idea(**idea_kwargs(engineer, proposer="llm:gpt-4o"))
    search = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    notes.add_note(search=search, text=HOSTILE, author=engineer)
    html = get(engineer_client, reverse("searches:search", args=[search.pk]))
    assert_inert(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the note is there, as text
    panel = get(engineer_client, reverse("searches:search_llm", args=[search.pk]))
    assert_fragment_inert(panel)
    response = engineer_client.post(
        reverse("searches:search_note", args=[search.pk]),
        {"text": HOSTILE},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    assert_fragment_inert(response.content.decode())


def test_hostile_gpu_kinds_and_worker_names_render_inert(engineer_client, search, redis_url):
    register(
        redis_url,
        f"host:{SHORT_HOSTILE}",
        {"kind": "h200", "name": SHORT_HOSTILE, "queue": "gpu.h200", "job": HOSTILE},
    )
    trial = propose(search, 1, rationale=HOSTILE)
    report = accepted()  # a hostile kind is refused as malformed: tests/web/test_bad_input.py
    report["device"]["name"] = HOSTILE
    report["shapes"] = [
        {"label": HOSTILE, "candidate_ms": 0.1, "speedup_eager": 1.5, "gbps": 100.0, "tflops": 1.0}
    ]
    judge(trial, report)
    for url in (
        reverse("searches:workers"),
        reverse("searches:dashboard"),
        reverse("searches:gpus"),
    ):
        html = get(engineer_client, url)
        assert_inert(html)
        for raw in (*HOSTILE_RAW, SHORT_HOSTILE):
            assert raw not in html, (url, raw)
    for url in (
        reverse("searches:dashboard_charts"),
        reverse("searches:problem_charts", args=["softmax"]),
        reverse("searches:search_charts", args=[search.pk]),
    ):
        assert_fragment_inert(get(engineer_client, url))
    data = get(
        engineer_client, reverse("searches:search_charts", args=[search.pk]) + "?format=json"
    )
    for raw in HOSTILE_RAW:
        assert raw not in data  # JsonResponse escapes nothing: the labels themselves must be
    json.loads(data)


def test_chart_labels_reach_plotly_as_text_not_markup(engineer_client, search):
    """plotly.js renders a subset of HTML (<a href>, <span style>, <b>) in titles and hover
    labels; what people or models wrote must arrive with its < and > escaped."""
    trial = propose(search, 1, rationale='<a href="https://evil.example">click</a>')
    judge(trial, accepted())
    payload = get(
        engineer_client, reverse("searches:search_charts", args=[search.pk]) + "?format=json"
    )
    assert "<a href" not in payload
    assert re.search(r"&lt;a href=.*evil\.example.*&gt;click&lt;/a&gt;", payload)
