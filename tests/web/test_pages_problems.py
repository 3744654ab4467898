"""The problem registry pages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from kernels import problems as registry

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def test_the_list_links_every_problem(engineer_client):
    html = engineer_client.get(reverse("searches:problems")).content.decode()
    for name in registry.names():
        assert f'href="{reverse("searches:problem", args=[name])}"' in html
        assert registry.load(name).signature in html


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "attention"])
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
