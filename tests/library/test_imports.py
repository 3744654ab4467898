"""Importing harness reports measured on another host (searches/imports.py, manage.py
import_reports), and how imported trials show on the review pages: the real H200 reports under
docs/benchmarks/h200/, files made here, and the bad ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from kernels.worker import register, rq_queue, worker_key
from library import selectors
from library.models import Review
from searches import imports
from searches.models import Idea, ReportImport, Search, Trial

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "docs" / "benchmarks" / "h200"
PROOF_C = H200 / "proof-2026-12-02-c.json"  # softmax, rmsnorm, layernorm, swiglu: tuned + seed
CLI_REPORT = H200 / "cli-softmax-seed-full.json"  # an evaluate --json report without its source
SEED = (ROOT / "kernels" / "seeds" / "softmax.py").read_text()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


NULL = object()  # a value of JSON null, in cli_report's changes


def cli_report(tmp_path: Path, **changes) -> Path:
    """The H200 `evaluate --json` report, as the CLI writes it now (with its source and the
    source's sha256), changed by `changes` (None deletes a key, NULL makes it null)."""
    data = json.loads(CLI_REPORT.read_text())
    data.update(source=SEED, source_sha256=sha(SEED))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        elif value is NULL:
            data[key] = None
        else:
            data[key] = value
    out = tmp_path / "report.json"
    out.write_text(json.dumps(data))
    return out


def counts() -> tuple[int, int, int, int]:
    return (
        Idea.objects.count(),
        Search.objects.count(),
        Trial.objects.count(),
        ReportImport.objects.count(),
    )


@pytest.fixture
def softmax_import(engineer):
    return imports.import_file(PROOF_C, user=engineer, problems=["softmax"])


def test_an_h200_bundle_report_imports_with_its_origin_and_waits_for_review(
    softmax_import, engineer
):
    (trial,) = softmax_import.imported
    bundle = json.loads(PROOF_C.read_text())["problems"]["softmax"]
    # The seed's report is skipped: the bundle does not carry the source it judged.
    assert softmax_import.skipped == ["problems.softmax.seed: the bundle does not carry its source"]
    origin = trial.imported
    assert (origin.host, origin.kind, origin.device_name) == ("vm", "h200", "NVIDIA H200")
    assert origin.versions["torch"] == "2.11.0+cu130" and origin.versions["triton"] == "3.6.0"
    assert origin.source_sha256 == sha(bundle["honest_tuned_source"]) == trial.source_sha256
    assert origin.imported_by == engineer and origin.entry == "problems.softmax.honest_tuned"
    assert origin.label == "imported from vm (h200)"
    assert trial.source == bundle["honest_tuned_source"]
    assert trial.status == Trial.Status.KEPT and trial.device_kind == "h200"
    assert trial.speedup_eager == pytest.approx(
        bundle["honest_tuned"]["summary"]["geomean_speedup_eager"]
    )
    search = trial.search
    assert search.status == Search.Status.FINISHED and search.incumbent_id == trial.pk
    assert search.idea.title == "Imported reports: softmax on h200"
    assert search.idea.target_kinds == ["h200"]  # approval re-validates on h200
    assert selectors.why_not_candidate(trial) is None
    assert [t.pk for t in selectors.review_queue().trials] == [trial.pk]


def test_importing_the_same_report_again_changes_nothing(softmax_import, engineer):
    before = counts()
    again = imports.import_file(PROOF_C, user=engineer, problems=["softmax"])
    assert again.imported == [] and [t.pk for t in again.already] == [
        t.pk for t in softmax_import.imported
    ]
    assert counts() == before


def test_each_import_is_its_own_search_so_none_replaces_another(engineer):
    out = imports.import_file(PROOF_C, user=engineer)
    assert len(out.imported) == 4 and len(out.skipped) == 4
    assert Idea.objects.filter(proposer=imports.IMPORTED).count() == 4  # one per problem, kind
    queued = {t.search.idea.problem for t in selectors.review_queue().trials}
    # swiglu's tuned kernel is 0.99x torch.compile: imported, but not a candidate.
    assert queued == {"softmax", "rmsnorm", "layernorm"}
    swiglu = next(t for t in out.imported if t.search.idea.problem == "swiglu")
    assert "not faster than torch.compile" in selectors.why_not_candidate(swiglu)


def test_a_cli_report_carrying_its_source_imports(engineer, tmp_path):
    (trial,) = imports.import_file(cli_report(tmp_path), user=engineer).imported
    assert trial.source == SEED and trial.imported.source_sha256 == sha(SEED)
    assert "source" not in trial.report and trial.report["source_sha256"] == sha(SEED)
    assert trial.imported.entry == "" and trial.imported.file.endswith("report.json")


def test_a_report_without_its_source_takes_the_candidate_and_checks_its_hash(engineer, tmp_path):
    path = cli_report(tmp_path, source=None)
    (trial,) = imports.import_file(path, user=engineer, candidate=SEED).imported
    assert trial.source == SEED
    with pytest.raises(imports.ReportImportError, match="source hash mismatch"):
        imports.import_file(path, user=engineer, candidate=SEED + "# changed\n")


def test_a_report_without_any_source_is_refused_with_what_to_do(engineer):
    with pytest.raises(imports.ReportImportError, match="carries no source.*--candidate"):
        imports.import_file(CLI_REPORT, user=engineer)
    assert counts() == (0, 0, 0, 0)


BAD_FILES = {
    "not json": ("{'verdict': 'accepted'", "is not JSON"),
    "a list": ("[1, 2]", "holds a JSON list, not a harness report"),
    "not a report": ('{"kind": "h200"}', "neither a harness report"),
    "an empty bundle": ('{"problems": {"softmax": {"seed": 1}}}', "holds no harness reports"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_file_that_is_no_report_is_refused_clearly(name, engineer, tmp_path):
    text, message = BAD_FILES[name]
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(imports.ReportImportError, match=message):
        imports.import_file(path, user=engineer)
    assert counts() == (0, 0, 0, 0)


BAD_REPORTS = {
    "source hash mismatch": ({"source_sha256": "0" * 64}, "source hash mismatch"),
    "unknown problem": ({"problem": "no_such_op"}, "unknown problem 'no_such_op'"),
    "missing shapes": ({"shapes": None}, "not a harness report: it lacks shapes"),
    "bad verdict": ({"verdict": "maybe"}, "verdict must be"),
    "rejected without failure": ({"verdict": "rejected"}, "names its failure"),
    "no GPU kind": ({"device": {"name": "?"}}, "names no GPU kind"),
    "summary not an object": ({"summary": []}, "summary is a JSON object"),
    "summary a string": ({"summary": "x"}, "summary is a JSON object"),
    "null summary": ({"summary": NULL}, "summary is not an object"),
    "null shapes": ({"shapes": NULL}, "shapes is not a list"),
    "checks a list": ({"checks": []}, "checks is a JSON object"),
}


@pytest.mark.parametrize("name", BAD_REPORTS)
def test_a_bad_report_imports_nothing(name, engineer, tmp_path):
    changes, message = BAD_REPORTS[name]
    with pytest.raises(imports.ReportImportError, match=message):
        imports.import_file(cli_report(tmp_path, **changes), user=engineer)
    assert counts() == (0, 0, 0, 0)


def test_one_bad_report_in_a_bundle_imports_nothing_of_that_bundle(engineer, tmp_path):
    data = json.loads(PROOF_C.read_text())
    data["problems"]["layernorm"]["honest_tuned_source"] += "# not what was judged\n"
    data["problems"]["layernorm"]["honest_tuned"]["source_sha256"] = sha("something else")
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(data))
    with pytest.raises(imports.ReportImportError, match=r"layernorm.honest_tuned.*mismatch"):
        imports.import_file(path, user=engineer)
    assert counts() == (0, 0, 0, 0)


def test_the_command_imports_the_good_files_and_names_the_bad_ones(engineer, tmp_path, capsys):
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "a-good.json").write_text(PROOF_C.read_text())
    (folder / "b-bad.json").write_text("not json")
    with pytest.raises(CommandError, match="1 of 2 files not imported"):
        call_command("import_reports", str(folder), "--user", engineer.username)
    out = capsys.readouterr()
    assert "a-good.json: 4 imported, 0 already imported, 4 skipped" in out.out
    assert "b-bad.json is not JSON" in out.err
    assert ReportImport.objects.count() == 4
    call_command(
        "import_reports",
        str(folder / "a-good.json"),
        "--user",
        engineer.username,
        "--problem",
        "rmsnorm",
    )
    assert "0 imported, 1 already imported" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("import_reports", str(folder), "--user", "nobody")


def test_the_command_takes_a_candidate_for_a_report_without_its_source(engineer, tmp_path):
    source = tmp_path / "softmax.py"
    source.write_text(SEED)
    call_command(
        "import_reports", str(CLI_REPORT), "--user", engineer.username, "--candidate", str(source)
    )
    assert Trial.objects.get().source == SEED


# -- pages --------------------------------------------------------------------------------------


@pytest.fixture
def reviewer_client(client, reviewer):
    client.force_login(reviewer)
    return client


def test_an_imported_trial_shows_as_imported_on_every_page(
    reviewer_client, softmax_import, redis_url, django_capture_on_commit_callbacks
):
    (trial,) = softmax_import.imported
    label = "imported from vm (h200)"
    trial_page = reviewer_client.get(
        reverse("searches:trial", args=[trial.search_id, trial.index])
    ).content.decode()
    assert "Imported from vm (h200):" in trial_page and trial.source_sha256[:16] in trial_page
    assert 'id="review-status" data-state="queued"' in trial_page
    queue = reviewer_client.get(reverse("library:queue")).content.decode()
    assert label in queue
    review_url = reverse("library:review", args=[trial.pk])
    review = reviewer_client.get(review_url).content.decode()
    assert label in review and 'id="imported-from"' in review
    search_page = reviewer_client.get(reverse("searches:search", args=[trial.search_id]))
    assert search_page.status_code == 200
    assert "Imported reports: softmax on h200" in search_page.content.decode()
    idea_page = reviewer_client.get(reverse("searches:idea", args=[trial.search.idea_id]))
    assert idea_page.status_code == 200

    # Approval re-validates on h200, where no worker is online: the wait is said, not hidden.
    with django_capture_on_commit_callbacks(execute=True):
        reviewer_client.post(
            reverse("library:decide", args=[trial.pk]),
            {
                "action": "approve",
                "request_key": "k",
                "range_M_lo": "1",
                "range_M_hi": "4096",
                "range_N_lo": "128",
                "range_N_hi": "32768",
            },
        )
    assert Review.objects.get(trial=trial).revalidations.get().kind == "h200"
    assert len(rq_queue("gpu.h200", redis_url).jobs) == 1
    waiting = "awaiting re-validation on h200: no h200 worker is online"
    review = reviewer_client.get(review_url)
    (message,) = review.context["messages"]
    assert f"Re-validation is queued on every target GPU kind. A{waiting[1:]}" in str(message)
    html = review.content.decode()
    assert waiting in html and "(none has been online)" in html
    releases = reviewer_client.get(reverse("library:releases")).content.decode()
    assert 'id="awaiting-revalidation"' in releases and waiting in releases
    assert label in releases
    trial_page = reviewer_client.get(
        reverse("searches:trial", args=[trial.search_id, trial.index])
    ).content.decode()
    assert 'data-state="decided"' in trial_page and waiting in trial_page

    # An h200 worker comes online: the re-validation is running, not awaiting.
    register(redis_url, "box:gpu0", {"kind": "h200", "name": "NVIDIA H200"})
    html = reviewer_client.get(review_url).content.decode()
    assert waiting not in html and "re-validating on h200 (1 worker online)" in html
    # It goes away again: the page says since when none is online.
    redis_url.delete(worker_key("box:gpu0"))
    html = reviewer_client.get(review_url).content.decode()
    assert waiting in html and "(none online since " in html


def test_a_release_of_an_imported_trial_shows_where_it_was_measured(
    reviewer_client, reviewer, softmax_import
):
    from library import services
    from tests.library.test_releases import reval_report

    (trial,) = softmax_import.imported
    review = services.decide(
        trial=trial, user=reviewer, action="approve", shape_range={"M": [1, 64], "N": [1, 4096]}
    )
    services.record_revalidation(
        revalidation=review.revalidations.get(), report=reval_report(geomean_speedup_eager=1.5)
    )
    releases = reviewer_client.get(reverse("library:releases")).content.decode()
    assert "imported from vm (h200)" in releases and 'id="awaiting-revalidation"' not in releases
    release = review.revalidations.get().release
    page = reviewer_client.get(reverse("library:release", args=[release.pk])).content.decode()
    assert "imported from vm (h200)" in page


def test_a_report_written_by_evaluate_json_here_imports_as_it_is(engineer, tmp_path):
    import os
    import subprocess
    import sys

    out = tmp_path / "seed.json"
    done = subprocess.run(
        [sys.executable, "-m", "kernels", "evaluate", "--problem", "softmax", "--candidate"]
        + [str(ROOT / "kernels" / "seeds" / "softmax.py")]
        + ["--device", "interpret", "--json", str(out), "--quiet"],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), done.stderr[-3000:]
    (trial,) = imports.import_file(out, user=engineer).imported
    assert trial.source == SEED and trial.device_kind == "interpret"
    assert trial.imported.source_sha256 == sha(SEED)
    # Kept, but never a review candidate: the interpreter times nothing.
    assert "untimed" in selectors.why_not_candidate(trial)
