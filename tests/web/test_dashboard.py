from __future__ import annotations

import re

import pytest
from django.contrib.auth import SESSION_KEY
from django.urls import reverse

from kernels import problems as registry

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(username="ada", password="correct-horse-42")


def test_an_anonymous_visitor_is_sent_to_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next=/"


def test_a_logged_in_user_sees_every_registered_problem(client, user):
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    names = registry.names()
    assert "softmax" in names
    for name in names:
        problem = registry.load(name)
        assert f'id="problem-{name}"' in html
        assert problem.signature in html
        for shape in problem.to_dict()["shapes"]["full"]:
            assert shape in html
    assert "failed to load" not in html


def test_the_dashboard_shows_a_broken_problem_instead_of_failing(
    client, user, tmp_path, monkeypatch
):
    (tmp_path / "broken_problem.py").write_text("SIGNATURE = 'kernel(x)'\n")  # lacks the rest
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(tmp_path))
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "failed to load" in html
    assert "broken_problem" in html
    assert 'id="problem-softmax"' in html


def test_logging_in_with_the_form_starts_a_session_and_lands_on_the_dashboard(client, user):
    response = client.post(
        reverse("login"), {"username": "ada", "password": "correct-horse-42", "next": "/"}
    )
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert int(client.session[SESSION_KEY]) == user.pk


def test_a_wrong_password_shows_an_error_and_starts_no_session(client, user):
    response = client.post(reverse("login"), {"username": "ada", "password": "nope"})
    assert response.status_code == 200
    assert "correct username and password" in response.content.decode()
    assert SESSION_KEY not in client.session


def test_logging_out_ends_the_session(client, user):
    client.force_login(user)
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert SESSION_KEY not in client.session
    assert client.get("/").status_code == 302


def test_pages_load_nothing_from_other_hosts(client, user):
    pages = [client.get(reverse("login")).content.decode()]
    client.force_login(user)
    pages.append(client.get("/").content.decode())
    for html in pages:
        assert not re.search(r"""(?:src|href)=["'](?:https?:)?//""", html)
        assert "/static/css/app.css" in html
