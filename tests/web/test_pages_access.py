"""Every page needs a login; objects need the engineers role; nothing changes over GET."""

from __future__ import annotations

import pytest
from django.urls import reverse

from searches.models import Idea, Search
from tests.web.domain import propose

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def _pages(search) -> list[str]:
    trial = propose(search, 1)
    return [
        reverse("searches:dashboard"),
        reverse("searches:ideas"),
        reverse("searches:idea_new"),
        reverse("searches:idea", args=[search.idea_id]),
        reverse("searches:search", args=[search.pk]),
        reverse("searches:trial", args=[search.pk, trial.index]),
        reverse("searches:problems"),
        reverse("searches:problem", args=["softmax"]),
        reverse("searches:workers"),
    ]


def test_every_page_sends_an_anonymous_visitor_to_login(client, search):
    for url in _pages(search):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"] == f"{reverse('login')}?next={url}", url


def test_anonymous_posts_change_nothing(client, search, idea):
    for name in ("search_pause", "search_stop"):
        response = client.post(reverse(f"searches:{name}", args=[search.pk]))
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    client.post(reverse("searches:idea_start", args=[idea.pk]), {"request_key": "k1"})
    client.post(reverse("searches:idea_new"), {"title": "x", "problem": "softmax"})
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING
    assert Search.objects.count() == 1
    assert Idea.objects.count() == 1


def test_a_user_without_a_role_is_refused_ideas_searches_and_trials(outsider_client, search):
    trial = propose(search, 1)
    for url in (
        reverse("searches:ideas"),
        reverse("searches:idea_new"),
        reverse("searches:idea", args=[search.idea_id]),
        reverse("searches:search", args=[search.pk]),
        reverse("searches:trial", args=[search.pk, trial.index]),
    ):
        response = outsider_client.get(url)
        assert response.status_code == 403, url
        assert "Only engineers may" in response.content.decode(), url


def test_a_user_without_a_role_cannot_pause_or_start(outsider_client, search, idea):
    response = outsider_client.post(reverse("searches:search_pause", args=[search.pk]))
    assert response.status_code == 403
    response = outsider_client.post(
        reverse("searches:idea_start", args=[idea.pk]), {"request_key": "k-outsider"}
    )
    assert response.status_code == 403
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING
    assert Search.objects.count() == 1


def test_a_user_without_a_role_still_sees_problems_and_workers(outsider_client):
    for name in ("dashboard", "problems", "workers"):
        assert outsider_client.get(reverse(f"searches:{name}")).status_code == 200


@pytest.mark.parametrize("name", ["search_pause", "search_resume", "search_stop", "idea_start"])
def test_state_changing_urls_refuse_get(engineer_client, search, name):
    target = search.idea_id if name == "idea_start" else search.pk
    response = engineer_client.get(reverse(f"searches:{name}", args=[target]))
    assert response.status_code == 405
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING
    assert Search.objects.count() == 1


def test_posts_need_a_csrf_token(client, engineer, search):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(engineer)
    response = strict.post(reverse("searches:search_pause", args=[search.pk]))
    assert response.status_code == 403
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING


def test_missing_objects_are_404(engineer_client, search):
    assert engineer_client.get(reverse("searches:search", args=[999999])).status_code == 404
    assert engineer_client.get(reverse("searches:idea", args=[999999])).status_code == 404
    assert engineer_client.get(reverse("searches:trial", args=[search.pk, 99])).status_code == 404
    response = engineer_client.get(reverse("searches:problem", args=["no_such_problem"]))
    assert response.status_code == 404


def test_the_page_csrf_header_lets_an_htmx_post_through(engineer, search):
    import re

    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(engineer)
    html = strict.get(reverse("searches:search", args=[search.pk])).content.decode()
    assert "/static/vendor/htmx-2.0.11.min.js" in html
    assert "/static/vendor/htmx-ext-ws-2.0.4.js" in html
    token = re.search(r"""hx-headers='\{"X-CSRFToken": "(\w+)"\}'""", html).group(1)
    response = strict.post(
        reverse("searches:search_pause", args=[search.pk]),
        headers={"X-CSRFToken": token, "HX-Request": "true"},
    )
    assert response.status_code == 200
    search.refresh_from_db()
    assert search.status == Search.Status.PAUSED
