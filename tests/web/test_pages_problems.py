"""The problem registry pages."""

from __future__ import annotations

import pytest
import torch
from django.urls import reverse

from kernels import problems as registry

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def test_the_list_links_every_problem(engineer_client):
    html = engineer_client.get(reverse("searches:problems")).content.decode()
    for name in registry.names():
        assert f'href="{reverse("searches:problem", args=[name])}"' in html
        assert registry.load(name).signature in html


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "attention", "matmul_bias_gelu"])
def test_a_problem_page_shows_signature_reference_sweeps_and_tolerances(engineer_client, name):
    problem = registry.load(name)
    response = engineer_client.get(reverse("searches:problem", args=[name]))
    assert response.status_code == 200
    html = response.content.decode()
    assert problem.signature in html
    assert problem.description.split(".")[0] in html
    reference = html[html.index('id="reference"') :]
    assert '<span class="nf">reference</span>' in reference
    assert '<span class="k">def</span><span class="w"> </span>' in reference
    for tier, id_ in (("full", "shapes-full"), ("smoke", "shapes-smoke")):
        chips = html[html.index(f'id="{id_}"') :]
        for shape in problem.to_dict()["shapes"][tier]:
            assert f'<span class="chip">{shape}</span>' in chips
    tolerances = html[html.index('id="tolerances"') :]
    for dtype, tol in problem.module.TOLERANCE.items():
        assert f"<code>{str(dtype).replace('torch.', '')}</code>" in tolerances
        cells = "".join(f'<td class="num">{tol[k]:.4g}</td>' for k in ("atol", "rtol", "l2"))
        floor = tol.get("rms_floor")
        cells += f'<td class="num">{"—" if floor is None else format(floor, ".4g")}</td>'
        assert cells in tolerances
    for device, dtype in problem.to_dict()["dtypes"].items():
        assert f"<td>{device}</td><td><code>{dtype}</code></td>" in html
    assert 'id="seed"' in html
    assert f"{reverse('searches:idea_new')}?problem={name}" in html


def test_an_unknown_problem_is_404(engineer_client):
    response = engineer_client.get(reverse("searches:problem", args=["nope"]))
    assert response.status_code == 404
    assert "Not found" in response.content.decode()


def test_a_broken_problem_module_is_shown_not_raised(engineer_client, tmp_path, monkeypatch):
    (tmp_path / "broken_problem.py").write_text("SIGNATURE = 'kernel(x)'\n")
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(tmp_path))
    response = engineer_client.get(reverse("searches:problem", args=["broken_problem"]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "failed to load" in html
    assert "lacks" in html
    listing = engineer_client.get(reverse("searches:problems")).content.decode()
    assert "failed to load" in listing and 'id="problem-softmax"' in listing


def test_the_new_idea_form_preselects_the_problem_it_came_from(engineer_client):
    response = engineer_client.get(reverse("searches:idea_new"), {"problem": "rmsnorm"})
    html = response.content.decode()
    assert '<option value="rmsnorm" selected>' in html


# -- the user's own problems (AUTOWEB_PROBLEM_DIRS) ----------------------------------------------


@pytest.fixture
def users_dir(tmp_path, monkeypatch):
    """A problem directory with a working problem, one that raises at import, one that exits,
    and one named like a built-in."""
    from tests.kernels.test_cli import ROWSCALE

    (tmp_path / "rowscale.py").write_text(ROWSCALE)
    (tmp_path / "exploding.py").write_text("raise RuntimeError('no GPU library here')\n")
    (tmp_path / "quitter.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "softmax.py").write_text(ROWSCALE)
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(tmp_path))
    return tmp_path


def test_the_users_problems_are_listed_as_theirs_with_their_source_file(engineer_client, users_dir):
    html = engineer_client.get(reverse("searches:problems")).content.decode()
    card = html[html.index('id="problem-rowscale"') :]
    card = card[: card.index("</article>")]
    assert '<span class="chip chip-yours"' in card and ">yours</span>" in card
    assert f'<code class="source-file">{users_dir / "rowscale.py"}</code>' in card
    softmax = html[html.index('id="problem-softmax"') :]
    assert '<span class="chip">built-in</span>' in softmax[: softmax.index("</article>")]
    page = engineer_client.get(reverse("searches:problem", args=["rowscale"])).content.decode()
    assert f'<code class="source-file">{users_dir / "rowscale.py"}</code>' in page


def test_problems_that_fail_to_load_are_listed_with_their_error_and_the_site_keeps_working(
    engineer_client, users_dir
):
    html = engineer_client.get(reverse("searches:problems")).content.decode()
    errors = html[html.index('id="problem-errors"') :]
    exploding = errors[errors.index('id="problem-error-exploding"') :]
    assert f"<code>{users_dir / 'exploding.py'}</code>" in exploding
    assert "RuntimeError: no GPU library here" in exploding
    assert "SystemExit: 3" in errors[errors.index('id="problem-error-quitter"') :]
    shadowed = errors[errors.index('id="problem-error-softmax"') :]
    assert f"<code>{users_dir / 'softmax.py'}</code>" in shadowed
    assert "a built-in problem has the same name" in shadowed
    assert 'id="problem-rowscale"' in html and 'id="problem-attention"' in html
    for url in (reverse("searches:dashboard"), reverse("searches:idea_new")):
        assert engineer_client.get(url).status_code == 200
    page = engineer_client.get(reverse("searches:problem", args=["exploding"]))
    assert page.status_code == 200
    body = page.content.decode()
    assert "exploding failed to load" in body and str(users_dir / "exploding.py") in body


def test_the_idea_form_offers_the_users_problems_and_takes_an_idea_on_one(
    engineer_client, users_dir
):
    from searches.models import Idea

    html = engineer_client.get(reverse("searches:idea_new")).content.decode()
    assert '<optgroup label="Your problems">' in html
    group = html[html.index('<optgroup label="Your problems">') :]
    group = group[: group.index("</optgroup>")]
    assert '<option value="rowscale">rowscale</option>' in group
    failed = html[html.index('<optgroup label="Failed to load">') :]
    assert '<option value="exploding">exploding (failed to load)</option>' in failed
    response = engineer_client.post(
        reverse("searches:idea_new"),
        {
            "title": "scale rows",
            "problem": "rowscale",
            "target_kinds": ["interpret"],
            "start_anyway": "on",  # no worker online in this test
            "proposer": "tuner",
            "max_trials": 3,
            "max_gpu_minutes": 5,
            "max_wall_minutes": 10,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Idea.objects.get().problem == "rowscale"
    pre = engineer_client.get(reverse("searches:idea_new"), {"problem": "rowscale"})
    assert '<option value="rowscale" selected>' in pre.content.decode()


def _floors(html: str) -> str:
    return html[html.index('id="roofline"') : html.index('id="reference"')]


def test_without_measured_ceilings_the_page_says_so_and_gives_no_floor(engineer_client, redis_url):
    from searches.models import Worker

    Worker.objects.create(name="old:gpu0", kind="h100", queue="gpu.h100", ceilings=None)
    roofline = _floors(
        engineer_client.get(reverse("searches:problem", args=["rmsnorm"])).content.decode()
    )
    assert 'id="no-ceilings"' in roofline
    assert "h100: no measured ceiling known." in roofline
    assert "µs" not in roofline
    # bytes and flops are still shown: M=4096, N=4096 in bf16 moves (2*M*N + N) * 2 bytes.
    row = roofline[roofline.index("<code>M=4096,N=4096</code>") :]
    assert f'<td class="num">{(2 * 4096 * 4096 + 4096) * 2 / 1e6:.4g}</td>' in row[:300]


def test_each_shape_shows_its_floor_on_every_kind_with_measured_ceilings(
    engineer_client, redis_url
):
    from kernels.queues import register

    ceilings = {"copy_gbps": 4000.0, "matmul_tflops_bf16": 700.0, "device": "NVIDIA H200"}
    register(
        redis_url, "gpuhost:gpu0", {"kind": "h200", "name": "NVIDIA H200", "ceilings": ceilings}
    )
    register(redis_url, "cpuhost:interpret", {"kind": "interpret", "name": "CPU", "ceilings": None})
    problem = registry.load("matmul")
    html = engineer_client.get(reverse("searches:problem", args=["matmul"])).content.decode()
    roofline = _floors(html)
    assert 'id="no-ceilings"' not in roofline and "no measured ceiling" not in roofline
    assert "h200 floor</th>" in roofline and "interpret floor" not in roofline
    for shape in problem.shapes("full"):
        nbytes, flops = problem.bytes(shape, torch.bfloat16), problem.flops(shape)
        mem, cmp = nbytes / 4000e9, flops / 700e12
        floor_us = max(mem, cmp) * 1e6
        bound = "compute" if cmp > mem else "memory"
        label = registry.shape_label(shape)
        row = roofline[roofline.index(f"<code>{label}</code>") :]
        row = row[: row.index("</tr>")]
        assert f'{floor_us:.3g} µs <span class="muted">{bound}</span>' in row, (label, row)
    assert "4000 GB/s copy, 700 TFLOP/s bf16, measured on NVIDIA H200 by gpuhost:gpu0" in roofline
