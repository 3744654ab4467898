"""Re-validation results become releases; releases are listed, revoked and exported."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import zipfile

import pytest
import torch
from django.test import Client
from django.urls import reverse

from kernels import library as runtime
from kernels import problems
from library import export, services
from library.models import Release, Revalidation
from searches.models import Idea
from tests.library.helpers import HONEST_SOFTMAX, candidate, venv_with
from tests.web.pages import HOSTILE, assert_inert

pytestmark = pytest.mark.django_db
ONES = "import torch\n\ndef kernel(x):\n    return torch.full_like(x, 7.0)\n"


def reval_report(passed: bool = True, **summary):
    return {
        "verdict": "accepted" if passed else "rejected",
        "failure": None if passed else "incorrect",
        "reasons": [] if passed else ["incorrect: M=1,N=4096: rel L2 0.2"],
        "dtype": "float32",
        "summary": {"geomean_speedup_eager": None, **summary},
        "checks": {"end_to_end": {"passed": passed, "detail": "block"}},
        "shapes": [{"label": "M=1,N=4096", "shape": {"M": 1, "N": 4096}}],
        "revalidation": {"passed": passed, "reasons": [] if passed else ["incorrect: N=4096"]},
    }


@pytest.fixture
def approved(search, reviewer):
    """An approval of a candidate targeting the interpreter, its re-validation queued."""
    Idea.objects.filter(pk=search.idea_id).update(target_kinds=["interpret"])
    search.refresh_from_db()
    trial = candidate(search, ONES)
    review = services.decide(
        trial=trial,
        user=reviewer,
        action="approve",
        shape_range={"M": [1, 64], "N": [1, 4096]},
        text="ok",
    )
    return review


def test_a_passing_revalidation_becomes_a_release(approved, reviewer):
    reval = approved.revalidations.get()
    services.record_revalidation(revalidation=reval, report=reval_report(geomean_speedup_eager=1.7))
    release = Release.objects.get()
    assert (release.problem, release.kind, release.dtype) == ("softmax", "interpret", "float32")
    assert release.shape_range == {"M": [1, 64], "N": [1, 4096]}
    assert release.source == ONES and release.approver == reviewer
    assert release.speedup_eager == 1.7 and release.active
    assert approved.outcome == "released"
    # Recording again changes nothing.
    services.record_revalidation(revalidation=reval, report=reval_report(passed=False))
    assert Release.objects.count() == 1
    assert Revalidation.objects.get().status == "passed"


def _timed(label, shape, ms, eager, compiled, spread=0.02):
    return {
        "label": label,
        "shape": shape,
        "candidate_ms": ms,
        "candidate_spread": spread,
        "eager_ms": eager,
        "eager_spread": spread,
        "compiled_ms": compiled,
        "compiled_spread": spread,
    }


def test_a_release_says_per_shape_whether_the_kernel_or_a_baseline_serves_it(
    approved, tmp_path, monkeypatch
):
    report = reval_report(geomean_speedup_eager=1.5)
    report["shapes"] = [
        _timed("M=1,N=1024", {"M": 1, "N": 1024}, 0.50, 0.90, 0.80),  # wins beyond noise
        _timed("M=2,N=1024", {"M": 2, "N": 1024}, 0.79, 0.90, 0.80),  # within noise of compile
        _timed("M=3,N=1024", {"M": 3, "N": 1024}, 0.70, 0.60, None),  # eager is faster
    ]
    services.record_revalidation(revalidation=approved.revalidations.get(), report=report)
    release = Release.objects.get()
    assert [r["serve"] for r in release.dispatch()] == ["kernel", "compiled", "eager"]
    entry = release.manifest_entry()
    assert entry["shapes"][1] == {
        "shape": {"M": 2, "N": 1024},
        "serve": "compiled",
        "ms": 0.79,
        "eager_ms": 0.90,
        "compiled_ms": 0.80,
    }
    # The exported library routes each shape the way the table says.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = export.write_dir([release], tmp_path / "lib")
    kernel = runtime.load("softmax", library_dir=out)
    routes = [kernel.route_of(torch.randn(m, 1024)) for m in (1, 2, 3, 4)]
    assert routes == ["kernel", "compiled", "eager", "kernel"]


def test_a_release_page_shows_its_per_shape_dispatch(approved, engineer_client):
    report = reval_report(geomean_speedup_eager=1.5)
    report["shapes"] = [
        _timed("M=1,N=1024", {"M": 1, "N": 1024}, 0.50, 0.90, 0.80),
        _timed("M=2,N=1024", {"M": 2, "N": 1024}, 0.79, 0.90, 0.80),
    ]
    services.record_revalidation(revalidation=approved.revalidations.get(), report=report)
    release = Release.objects.get()
    assert (release.dispatch_total, release.dispatch_on_kernel) == (2, 1)
    url = reverse("library:release", args=[release.pk])
    html = engineer_client.get(url).content.decode()
    block = html[html.index('id="dispatch"') :]
    assert "1 of 2 shapes on the kernel" in block
    assert block.index('class="serve-kernel"') < block.index('class="serve-compiled"')
    assert "torch.compile" in block and "0.8 ms" in block
    # The list says it per release and opens the same table in place (htmx asks the release
    # page, which answers with the table alone); without JS the link leads to it.
    listing = engineer_client.get(reverse("library:releases")).content.decode()
    row = listing[listing.index(f'data-release="{release.pk}"') :]
    row = row[: row.index("</tr>")]
    assert "1 of 2 shapes on the kernel</summary>" in row
    assert f'hx-get="{url}"' in row and f'href="{url}#dispatch"' in row
    part = engineer_client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in part and "1 of 2 shapes on the kernel" in part
    assert re.findall(r'<tr class="serve-(\w+)">', part) == ["kernel", "compiled"]
    assert "0.79 ms" in part and "0.9 ms" in part  # the kernel's and eager's times


def test_a_release_made_before_the_table_existed_still_exports_and_dispatches(
    release, tmp_path, monkeypatch
):
    Release.objects.filter(pk=release.pk).update(
        shapes=[{"label": "M=1,N=4096", "shape": {"M": 1, "N": 4096}, "candidate_ms": 0.1}]
    )
    release.refresh_from_db()
    assert release.dispatch() == [] and release.manifest_entry()["shapes"] == []
    client = Client()
    client.force_login(release.approver)
    html = client.get(reverse("library:release", args=[release.pk])).content.decode()
    assert "made before releases carried a per-shape table" in html
    listing = client.get(reverse("library:releases")).content.decode()
    row = listing[listing.index(f'data-release="{release.pk}"') :]
    assert "the kernel on its whole range" in row[: row.index("</tr>")]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = export.write_dir([release], tmp_path / "lib")
    x = torch.randn(1, 4096)
    kernel = runtime.load("softmax", library_dir=out)
    # Inside the release's range, with no table: its kernel, as before the table existed.
    assert kernel.choose(x)["id"] == release.pk and kernel.route_of(x) == "kernel"


def test_the_migration_counts_the_tables_of_releases_already_stored(approved):
    from django.apps import apps

    report = reval_report(geomean_speedup_eager=1.5)
    report["shapes"] = [
        _timed("M=1,N=1024", {"M": 1, "N": 1024}, 0.50, 0.90, 0.80),
        _timed("M=2,N=1024", {"M": 2, "N": 1024}, 0.40, 0.90, 0.80),
        _timed("M=3,N=1024", {"M": 3, "N": 1024}, 0.79, 0.90, 0.80),
    ]
    services.record_revalidation(revalidation=approved.revalidations.get(), report=report)
    stored = Release.objects.get().shapes
    old = {"label": "M=4,N=1024", "shape": {"M": 4, "N": 1024}, "candidate_ms": 0.1}
    # As before the migration: no counts, and a row stored before rows said who serves them.
    Release.objects.update(dispatch_total=0, dispatch_on_kernel=0, shapes=[*stored, old])
    migration = importlib.import_module("library.migrations.0003_release_dispatch_counts")
    migration.count(apps, None)
    release = Release.objects.get()
    assert (release.dispatch_total, release.dispatch_on_kernel) == (3, 2)


def test_a_failing_revalidation_releases_nothing_and_the_reviewer_sees_why(
    approved, reviewer_client_for
):
    reval = approved.revalidations.get()
    services.record_revalidation(revalidation=reval, report=reval_report(passed=False))
    assert not Release.objects.exists()
    assert approved.outcome == "rejected by re-validation"
    html = reviewer_client_for.get(
        reverse("library:review", args=[approved.trial_id])
    ).content.decode()
    assert 'id="revalidation"' in html and "incorrect: N=4096" in html


@pytest.fixture
def reviewer_client_for(client, reviewer):
    client.force_login(reviewer)
    return client


@pytest.fixture
def release(approved):
    reval = approved.revalidations.get()
    services.record_revalidation(revalidation=reval, report=reval_report(geomean_speedup_eager=2))
    return Release.objects.get()


def test_the_releases_page_lists_per_problem_and_kind(engineer_client, release):
    html = engineer_client.get(reverse("library:releases")).content.decode()
    assert 'id="releases-softmax-interpret"' in html
    assert "N 1–4096" in html and "2.00" in html


def test_revoking_keeps_the_row_and_stops_dispatch_and_export(
    reviewer_client_for, release, tmp_path
):
    response = reviewer_client_for.post(
        reverse("library:revoke", args=[release.pk]), {"reason": HOSTILE}
    )
    assert response.status_code == 302
    release.refresh_from_db()
    assert not release.active and release.revoke_reason == HOSTILE
    assert export.select(["softmax"]) == []
    html = reviewer_client_for.get(reverse("library:releases")).content.decode()
    assert "revoked" in html
    assert_inert(html)


def test_revoking_needs_a_reason_and_the_reviewer_role(engineer, reviewer_client_for, release):
    engineer_client = Client()
    engineer_client.force_login(engineer)
    assert (
        engineer_client.post(
            reverse("library:revoke", args=[release.pk]), {"reason": "x"}
        ).status_code
        == 403
    )
    reviewer_client_for.post(reverse("library:revoke", args=[release.pk]), {"reason": " "})
    assert engineer_client.get(reverse("library:revoke", args=[release.pk])).status_code == 405
    release.refresh_from_db()
    assert release.active


@pytest.mark.parametrize("name", problems.BUILTIN)
def test_the_exported_reference_is_the_problems_reference(name, tmp_path):
    path = tmp_path / f"{name}.py"
    path.write_text(export.reference_module(name))
    ref = runtime._import_file(path, f"exported_ref_{name}").reference
    problem = problems.load(name)
    inputs = problem.make_inputs(problem.shapes("smoke")[1], torch.float32, "cpu", 5)
    torch.testing.assert_close(ref(*inputs), problem.reference(*inputs))


def test_an_exported_directory_dispatches_the_release_and_falls_back(
    release, tmp_path, monkeypatch
):
    out = export.write_dir(export.select(["softmax"]), tmp_path / "lib")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = runtime.load("softmax", library_dir=out)
    assert kernel(torch.randn(4, 100)).unique().tolist() == [7.0]  # in range: the release
    x = torch.randn(100, 100)  # M outside 1..64: the reference
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))


def test_the_export_command_writes_a_directory_and_a_wheel(release, tmp_path):
    from django.core.management import call_command

    call_command("export_library", "--out", str(tmp_path / "d"), "--problem", "softmax")
    assert (tmp_path / "d" / "manifest.json").is_file()
    call_command("export_library", "--out", str(tmp_path / "w"), "--wheel")
    (wheel,) = (tmp_path / "w").glob("autoweb_kernels-0.1.0-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "autoweb_kernels/__init__.py" in names and "autoweb_kernels/manifest.json" in names


def test_the_download_is_a_wheel(engineer_client, release):
    response = engineer_client.get(reverse("library:download"), {"problem": "softmax"})
    assert response.status_code == 200
    assert "autoweb_kernels-0.1.0-py3-none-any.whl" in response["Content-Disposition"]


@pytest.mark.slow
def test_the_exported_wheel_works_in_a_fresh_environment_without_autoweb(
    search, reviewer, tmp_path
):
    """pip-install the wheel into a new virtual environment that sees torch, triton and numpy
    but not autoweb, and run a released Triton kernel on the CPU interpreter."""
    Idea.objects.filter(pk=search.idea_id).update(target_kinds=["interpret"])
    search.refresh_from_db()
    trial = candidate(search, HONEST_SOFTMAX)
    review = services.decide(
        trial=trial, user=reviewer, action="approve", shape_range={"M": [1, 64], "N": [1, 4096]}
    )
    services.record_revalidation(
        revalidation=review.revalidations.get(), report=reval_report(geomean_speedup_eager=1.2)
    )
    name, data = export.wheel_bytes(export.select(["softmax"]), package="mykernels")
    wheel = tmp_path / name
    wheel.write_bytes(data)

    py = venv_with(wheel, tmp_path)
    script = """
import importlib.util, torch
assert importlib.util.find_spec("kernels") is None, "autoweb is importable"
assert importlib.util.find_spec("django") is None, "django is importable"
import mykernels
k = mykernels.load("softmax")
x = torch.randn(5, 300)
assert k.choose(x) is not None, "in range: the release"
torch.testing.assert_close(k(x), torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
y = torch.randn(100, 300)
assert k.choose(y) is None, "M outside 1..64: the reference"
torch.testing.assert_close(k(y), torch.softmax(y, -1))
print("ok")
"""
    env = {"PATH": os.environ["PATH"], "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(py), "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("with_release", [False, True], ids=["no releases", "one release"])
def test_every_problem_loads_from_the_wheel_in_a_fresh_environment(
    with_release, search, reviewer, tmp_path, monkeypatch
):
    """The export carries every problem's reference, so `load(p)` works for each problem from
    the wheel alone, with no release at all and beside a release of another problem: the
    built-ins and a user's problem (from AUTOWEB_PROBLEM_DIRS) alike."""
    from tests.kernels.test_cli import ROWSCALE

    users = tmp_path / "users"
    users.mkdir()
    (users / "rowscale.py").write_text(ROWSCALE)
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(users))
    if with_release:
        Idea.objects.filter(pk=search.idea_id).update(target_kinds=["interpret"])
        search.refresh_from_db()
        trial = candidate(search, HONEST_SOFTMAX)
        review = services.decide(
            trial=trial, user=reviewer, action="approve", shape_range={"M": [1, 64], "N": [1, 4096]}
        )
        services.record_revalidation(
            revalidation=review.revalidations.get(), report=reval_report(geomean_speedup_eager=1.2)
        )
    releases = export.select()
    assert len(releases) == int(with_release)
    name, data = export.wheel_bytes(releases)
    wheel = tmp_path / name
    wheel.write_bytes(data)
    # Inputs and expected outputs made here, where the problems are importable.
    cases = {}
    for p in problems.all_problems():
        shape = p.shapes("smoke")[0]
        inputs = p.make_inputs(shape, p.dtype("interpret"), "cpu", seed=1)
        cases[p.name] = {"inputs": inputs, "expected": p.reference(*inputs)}
    torch.save(cases, tmp_path / "cases.pt")

    py = venv_with(wheel, tmp_path)
    script = """
import importlib.util, torch
assert importlib.util.find_spec("kernels") is None, "autoweb is importable"
import autoweb_kernels
assert "from autoweb_kernels import load" in autoweb_kernels.__doc__
cases = torch.load("cases.pt")
for name, case in cases.items():
    k = autoweb_kernels.load(name)
    got = k(*case["inputs"])
    torch.testing.assert_close(got, case["expected"], atol=1e-4, rtol=1e-4)
    print(name, k.route_of(*case["inputs"]))
"""
    env = {"PATH": os.environ["PATH"], "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(py), "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    routes = dict(line.split() for line in out.stdout.split("\n") if line.strip())
    assert set(routes) == set(cases) and len(cases) >= 9 and "rowscale" in routes
    released = {"softmax"} if with_release else set()
    assert {p for p, r in routes.items() if r == "kernel"} == released, routes


def test_released_speedups_give_the_best_active_release_per_kind_and_problem(release, search):
    from library import selectors

    rows = selectors.released_speedups()
    assert rows == [
        {
            "kind": "interpret",
            "problem": "softmax",
            "speedup_eager": 2.0,
            "speedup_compiled": None,
            "label": f"release #{release.pk} (trial {release.trial.index} of search #{search.pk})",
            "url": reverse("library:review", args=[release.trial_id]),
        }
    ]
    Release.objects.filter(pk=release.pk).update(revoked_at=release.created_at)
    assert selectors.released_speedups() == []


def test_the_charts_read_the_releases(release, engineer_client):
    from library import selectors
    from searches import chart_data

    assert chart_data.releases() == selectors.released_speedups() != []
    assert engineer_client.get(reverse("searches:dashboard")).status_code == 200
