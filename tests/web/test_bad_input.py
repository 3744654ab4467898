"""Bad input to the web side: a problem module declaring malformed shapes, an oversize sketch,
and a worker reporting a malformed result. A clear error each; nothing already saved is lost."""

from __future__ import annotations

import copy
import math

import pytest
from django.urls import reverse

from searches.models import Idea, Search, Trial
from searches.orchestrator import Loop
from searches.services import MAX_TEXT
from tests.kernels.test_cli import ROWSCALE
from tests.web.domain import accepted, judge, propose
from tests.web.test_pages_ideas import form_data

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


@pytest.fixture(autouse=True)
def in_memory_channel_layer(settings):
    """The loop publishes live events; keep them off the shared Redis."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def malformed_problem(tmp_path, monkeypatch):
    bad = 'SHAPES_SMOKE = [{"M": -4, "N": 8}]'
    good = 'SHAPES_SMOKE = [{"M": 1, "N": 1}, {"M": 7, "N": 300}, {"M": 3, "N": 5000}]'
    (tmp_path / "badshapes.py").write_text(ROWSCALE.replace(good, bad))
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(tmp_path))
    return "badshapes"


MESSAGE = "SHAPES_SMOKE[0][&#x27;M&#x27;] must be a positive integer; got -4"


def test_a_problem_with_malformed_shapes_is_shown_as_an_error_not_a_500(
    engineer_client, malformed_problem
):
    for url in (reverse("searches:problems"), reverse("searches:dashboard")):
        response = engineer_client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        assert MESSAGE in html, url
        assert 'id="problem-softmax"' in html  # the others are still listed
    page = engineer_client.get(reverse("searches:problem", args=[malformed_problem]))
    assert page.status_code == 200
    assert "failed to load" in page.content.decode() and MESSAGE in page.content.decode()


def test_an_idea_on_a_malformed_problem_is_refused_on_the_form(engineer_client, malformed_problem):
    response = engineer_client.post(
        reverse("searches:idea_new"), form_data(problem=malformed_problem, sketch_source="")
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "failed to load" in html and MESSAGE in html
    assert Idea.objects.count() == 0


def test_an_oversize_sketch_is_refused_on_its_field_and_kept_as_typed(engineer_client):
    sketch = form_data()["sketch_source"] + "#" * MAX_TEXT
    response = engineer_client.post(reverse("searches:idea_new"), form_data(sketch_source=sketch))
    assert response.status_code == 400
    html = response.content.decode()
    assert f"keep it within {MAX_TEXT:,}" in html
    assert "Nothing you typed was lost" in html
    assert Idea.objects.count() == 0


# -- a worker reporting a malformed result ------------------------------------------------------


def _report(**changes) -> dict:
    report = copy.deepcopy(accepted())
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = report
        for key in parents:
            node = node[key]
        node[last] = value
    return report


MALFORMED = [
    ("not a dict", None, "no report (NoneType)"),
    ("a list", [1, 2], "no report (list)"),
    ("shapes a string", _report(shapes="M=1,N=4096"), "shapes are a list"),
    ("shapes a dict", _report(shapes={"M=1": {"candidate_ms": 1}}), "shapes are a list"),
    ("checks a list", _report(checks=["ok"]), "checks is a JSON object"),
    ("summary a list", _report(summary=[0.1]), "summary is a JSON object"),
    ("reasons a string", _report(reasons="fine"), "list of strings"),
    ("verdict unknown", _report(verdict="great"), "verdict must be"),
    ("device kind markup", _report(device__kind="<b>h200</b>"), "device kind must be"),
    ("device kind a number", _report(device__kind=200), "device kind must be"),
    ("negative time", _report(summary__geomean_ms=-0.5), "geomean_ms must be above 0"),
    ("zero time", _report(summary__geomean_ms=0), "geomean_ms must be above 0"),
    ("negative noise", _report(summary__noise=-0.2), "noise must be 0 or more"),
]


@pytest.mark.parametrize(("what", "report", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_result_fails_the_trial_and_the_search_goes_on(
    search, redis_url, what, report, reason
):
    judge(propose(search, 1), accepted(ms=0.5))  # an incumbent the bad report must not displace
    trial = propose(search, 2)
    source = trial.source
    Loop(search.pk, conn=redis_url).record(trial, report)
    trial.refresh_from_db()
    assert trial.status == Trial.Status.FAILED
    assert trial.failure == "malformed"
    assert any(reason in r for r in trial.reasons), trial.reasons
    assert trial.source == source  # what was proposed is kept, for the page and the agent
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING
    assert search.incumbent.index == 1
    assert search.trials_failed == 1
    assert not math.isnan(search.gpu_seconds)


def test_nan_speedups_are_kept_as_text_and_never_win(engineer_client, search, redis_url):
    judge(propose(search, 1), accepted(ms=0.5))
    report = accepted(ms=0.1)
    report["summary"].update(
        geomean_ms=float("nan"), geomean_speedup_eager=float("inf"), noise=float("nan")
    )
    report["shapes"] = [
        {"label": "M=1,N=4096", "candidate_ms": float("nan"), "speedup_eager": float("inf")},
        {"label": "M=7,N=300", "tflops": "NaN", "gbps": -1, "candidate_ms": 0.1},
        "not a shape",
    ]
    trial = propose(search, 2)
    Loop(search.pk, conn=redis_url).record(trial, report)
    trial.refresh_from_db()
    assert trial.status == Trial.Status.REVERTED  # correct, but its timing proves nothing
    assert trial.geomean_ms is None and trial.speedup_eager is None
    assert trial.report["summary"]["geomean_ms"] == "NaN"
    search.refresh_from_db()
    assert search.incumbent.index == 1
    # Every page that reads reports still renders.
    for url in (
        reverse("searches:trial", args=[search.pk, trial.index]),
        reverse("searches:search", args=[search.pk]),
        reverse("searches:search_charts", args=[search.pk]),
        reverse("searches:gpus"),
        reverse("searches:dashboard_charts"),
        reverse("searches:problem_charts", args=["softmax"]),
    ):
        assert engineer_client.get(url).status_code == 200, url


def test_a_nul_character_anywhere_in_a_request_is_refused_before_a_view_runs(engineer_client):
    # PostgreSQL refuses NUL in text, so a view reached with one would fail with a 500 there.
    ideas = Idea.objects.count()
    for url in (
        reverse("library:releases") + "?problem=%00",
        reverse("library:download") + "?kind=a%00b",
        reverse("library:queue") + "?sort=%00",
    ):
        response = engineer_client.get(url)
        assert response.status_code == 400, url
        assert b"NUL character" in response.content
    posted = engineer_client.post(reverse("searches:idea_new"), form_data(title="a\x00b"))
    assert posted.status_code == 400
    assert Idea.objects.count() == ideas


def test_an_age_filter_past_any_date_is_taken_as_everything_or_nothing(engineer_client):
    for days in ("1000000000", "-1000000000", "1e300"):
        response = engineer_client.get(reverse("library:queue") + f"?max_age_days={days}")
        assert response.status_code == 200, days


def test_a_problem_that_fails_to_import_is_left_out_of_an_export_or_refused_by_name(
    engineer_client, tmp_path, monkeypatch
):
    (tmp_path / "boom.py").write_text("raise RuntimeError('no GPU library here')\n")
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(tmp_path))
    everything = engineer_client.get(reverse("library:download"))
    named = engineer_client.get(reverse("library:download") + "?problem=boom")

    assert everything.status_code == 200 and everything["Content-Type"] == "application/zip"
    assert named.status_code == 400
    assert b"cannot export 'boom'" in named.content and b"no GPU library here" in named.content
