"""The trial page: highlighted source, the diff against the parent, the report's tables, and
LLM-written text rendered inert."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from searches import services
from tests.web.domain import interpreted, propose, rejected
from tests.web.pages import (
    H200_REPORT,
    HOSTILE,
    HOSTILE_RAW,
    assert_inert,
    h200_report,
    judged,
    knob_variant,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def trial_page(client, trial) -> str:
    response = client.get(reverse("searches:trial", args=[trial.search_id, trial.index]))
    assert response.status_code == 200
    return response.content.decode()


def section(html: str, id_: str) -> str:
    start = html.index(f'id="{id_}"')
    return html[start : html.index("</section>", start)]


def test_the_source_is_highlighted_and_diffed_against_the_parent(engineer_client, search):
    parent = judged(search, knob_variant(2048), h200_report())
    child = judged(search, knob_variant(4096), h200_report(geomean_ms=0.05), parent=parent)
    html = trial_page(engineer_client, child)
    source = section(html, "source")
    assert '<div class="highlight">' in source
    assert '<span class="n">BLOCK_N</span>' in source
    assert '<span class="mi">4096</span>' in source
    diff = section(html, "diff")
    assert "against trial 1" in diff
    assert '<span class="gd">--- trial 1</span>' in diff
    assert '<span class="gi">+++ trial 2</span>' in diff
    assert re.search(r'<span class="gd">-BLOCK_N = 2048 .*</span>', diff)
    assert re.search(r'<span class="gi">\+BLOCK_N = 4096 .*</span>', diff)
    assert diff.count('<span class="gi">+') == 2  # the header and the one changed line
    assert reverse("searches:trial", args=[search.pk, parent.index]) in html


def test_a_trial_without_parent_says_so(engineer_client, search):
    trial = judged(search, knob_variant(2048), h200_report())
    assert "No parent" in section(trial_page(engineer_client, trial), "diff")


def test_the_checks_and_per_shape_tables_come_from_the_report(engineer_client, search):
    trial = judged(search, knob_variant(2048), h200_report())
    html = trial_page(engineer_client, trial)
    checks = section(html, "checks")
    for name in H200_REPORT["checks"]:
        assert f"<code>{name}</code>" in checks
    assert 'badge-kept">passed' in checks
    shapes = section(html, "shapes")
    for shape in H200_REPORT["shapes"]:
        assert f"<code>{shape['label']}</code>" in shapes
    first = H200_REPORT["shapes"][0]
    assert f"{first['speedup_eager']:.2f}×" in shapes
    assert first["bound"] in shapes and first["timing_mode"] in shapes
    device = section(html, "device")
    assert "NVIDIA H200" in device
    assert "triton 3.6.0" in device and "torch 2.11.0+cu130" in device
    assert "copy 4177 GB/s" in device
    summary = html[html.index('id="summary"') :]
    assert "geomean speedup vs eager" in summary


def test_a_shape_screening_stopped_lost_says_so_with_its_samples(engineer_client, search):
    report = h200_report()
    lost, tight = report["shapes"][0], report["shapes"][1]
    lost.update(candidate_samples=6, candidate_slower_than_ms=0.0123)
    tight.update(candidate_samples=14)
    trial = judged(search, knob_variant(2048), report)
    shapes = section(trial_page(engineer_client, trial), "shapes")

    rows = {row.split("</code>")[0]: row for row in shapes.split("<code>")[1:]}
    assert "6 samples" in rows[lost["label"]]
    assert "stopped, slower than 0.0123 ms" in rows[lost["label"]]
    assert "14 samples" in rows[tight["label"]] and "stopped" not in rows[tight["label"]]
    # A report made before screening could stop, or with garbage there, shows neither.
    old = h200_report()
    del old["shapes"][1]["candidate_samples"]
    old["shapes"][0].update(candidate_samples=True, candidate_slower_than_ms=-1.0)
    trial = judged(search, knob_variant(4096), old)
    shapes = section(trial_page(engineer_client, trial), "shapes")
    rows = {row.split("</code>")[0]: row for row in shapes.split("<code>")[1:]}
    for label in (lost["label"], tight["label"]):
        assert "samples" not in rows[label] and "stopped," not in rows[label], rows[label]


def test_the_checks_card_says_which_oracle_computed_the_references(engineer_client, search):
    report = h200_report()
    report["references"] = {"compiled": 40, "eager": 4}
    checks = section(
        trial_page(engineer_client, judged(search, knob_variant(2048), report)), "checks"
    )
    assert "40 from the compiled oracle, on shapes where it had agreed with the eager one" in checks
    assert "and 4 from the eager oracle" in checks

    report["references"] = {"compiled": 0, "eager": 44}
    checks = section(
        trial_page(engineer_client, judged(search, knob_variant(4096), report)), "checks"
    )
    assert "all 44 from the eager oracle" in checks
    # A report from before, or with garbage there, says nothing of it.
    for i, refs in enumerate(({"compiled": True, "eager": 4}, {"compiled": -1}, "40", None)):
        report["references"] = refs
        trial = judged(search, knob_variant(8192 + i), report)
        assert 'id="references"' not in section(trial_page(engineer_client, trial), "checks")


def test_the_device_card_says_which_sandbox_layers_the_candidate_ran_under(engineer_client, search):
    # The recorded H200 report predates Landlock and the socket filter: it must not claim them.
    old = judged(search, knob_variant(2048), h200_report())
    device = section(trial_page(engineer_client, old), "device")
    assert '<span class="chip" title="applied">network namespace</span>' in device
    assert "without write confinement (Landlock)" in device
    assert "without socket filter (seccomp)" in device
    assert "signal scope" not in device  # not reported, so not shown either way

    report = h200_report()
    report["sandbox"].update(
        filesystem_confined=True,
        sockets_denied=True,
        confinement={"abi": 7, "filesystem": True, "tcp": True, "signals": True},
    )
    new = judged(search, knob_variant(4096), report, parent=old)
    device = section(trial_page(engineer_client, new), "device")
    assert "without" not in device
    for label in ("write confinement (Landlock ABI 7)", "socket filter (seccomp)", "signal scope"):
        assert f'<span class="chip" title="applied">{label}</span>' in device


def test_a_report_with_a_garbled_sandbox_entry_shows_none(engineer_client, search):
    report = h200_report()
    report["sandbox"] = {"network_isolated": "yes", "confinement": {"abi": HOSTILE}}
    trial = judged(search, knob_variant(2048), report)
    html = trial_page(engineer_client, trial)
    device = section(html, "device")
    assert "without network namespace" in device  # only a real true counts
    assert "write confinement (Landlock)" in device  # the ABI is shown only when it is a number
    assert_inert(html)
    report["sandbox"] = "not a dict"
    trial = judged(search, knob_variant(4096), report, parent=trial)
    assert "sandbox" not in section(trial_page(engineer_client, trial), "device")


def test_a_failed_trial_shows_its_category_and_reasons(engineer_client, search):
    trial = judged(search, knob_variant(2048), rejected("timeout", "timeout: 300 s at M=8192"))
    html = trial_page(engineer_client, trial)
    assert 'chip-failure">timeout' in html
    assert "Why it failed" in html
    assert "timeout: 300 s at M=8192" in section(html, "outcome")


def test_an_interpreted_trial_says_timings_are_not_meaningful(engineer_client, search):
    trial = judged(search, knob_variant(2048), interpreted())
    html = trial_page(engineer_client, trial)
    assert "CPU interpreter" in html
    assert "timings are not meaningful" in html
    device = section(html, "device")
    assert "<dt>CPU time</dt>" in device and "GPU time" not in device


def test_a_gpu_trial_says_gpu_time(engineer_client, search):
    trial = judged(search, knob_variant(2048), h200_report())
    device = section(trial_page(engineer_client, trial), "device")
    assert "<dt>GPU time</dt>" in device and "CPU time" not in device


def test_a_trial_in_flight_without_a_report_renders(engineer_client, search):
    trial = services.mark_trial_queued(trial=propose(search, 1), job_id="job-9")
    html = trial_page(engineer_client, trial)
    assert "Queued" in html
    assert 'id="checks"' not in html


def test_a_malformed_report_does_not_break_the_page(engineer_client, search):
    report = h200_report()
    report["checks"] = {"weird": "not a dict", "nan": {"passed": "maybe", "detail": None}}
    report["shapes"] = ["not a dict", {"label": "M=1", "candidate_ms": "NaN", "errors": []}]
    trial = judged(search, knob_variant(2048), report)
    html = trial_page(engineer_client, trial)
    assert "<code>weird</code>" in html and "not a dict" in html
    assert "<code>M=1</code>" in html and '<td class="num">NaN</td>' in html


def test_llm_written_text_renders_inert(engineer_client, search):
    hostile_source = f'"""{HOSTILE}"""\n' + knob_variant(2048) + f"# {HOSTILE}\n"
    parent = judged(search, knob_variant(1024), h200_report())
    report = rejected("incorrect", HOSTILE)
    report["checks"] = {HOSTILE: {"passed": False, "detail": HOSTILE}}
    report["shapes"] = [{"label": HOSTILE, "passed": False, "bound": HOSTILE}]
    report["device"]["name"] = HOSTILE
    trial = services.record_proposal(
        search=search,
        source=hostile_source,
        parent=parent,
        proposer="llm:gpt-4o",
        model="gpt-4o",
        rationale=HOSTILE,
        prompt=HOSTILE,
    )
    trial = services.record_result(trial=trial, report=report, gpu_seconds=1.0)
    html = trial_page(engineer_client, trial)
    assert_inert(html)
    # Django's autoescape escapes quotes too: none of the hostile text survives verbatim there.
    for id_ in ("rationale", "reasons", "prompt", "checks", "shapes", "device"):
        for raw in HOSTILE_RAW:
            assert raw not in section(html, id_), (id_, raw)
    # Pygments escapes <, > and &: the tags in source and diff are text, not markup.
    for id_ in ("source", "diff"):
        assert "<script>" not in section(html, id_) and "<img" not in section(html, id_)
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section(html, id_)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section(html, "rationale")
    assert "&lt;img src=x onerror=alert(1)&gt;" in section(html, "reasons")
    assert "hx-get=&quot;/x&quot;" in section(html, "prompt")
    assert "&lt;script&gt;" in section(html, "checks")
    assert "&lt;script&gt;" in section(html, "shapes")
