"""Login, CSRF and no-change-over-GET on every route the project serves, walked from its URL
resolver (tests/web/routes.py): a page added later is covered without being listed here."""

from __future__ import annotations

import logging
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse

from core.roles import ENGINEERS
from searches.models import Search
from tests.web.conftest import _user
from tests.web.domain import propose
from tests.web.routes import PUBLIC, routes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

LOGIN_PAGES = (reverse("login"), reverse("admin:login"))


@pytest.fixture
def admin_engineer(django_user_model):
    """An engineer who is also a superuser: every page and form opens for them."""
    return _user(django_user_model, "root", ENGINEERS, is_staff=True, is_superuser=True)


@pytest.fixture
def every_route(search) -> list:
    trial = propose(search, 1)
    return routes(
        {
            "pk": lambda name: search.idea_id if name.startswith("searches:idea") else search.pk,
            "index": trial.index,
            "kind": "model",
            "name": lambda name: "deepseek-mla-sparse" if name == "searches:pack" else "softmax",
            "app_label": "searches",
            "content_type_id": ContentType.objects.get_for_model(Search).pk,
            "object_id": search.pk,
        }
    )


def snapshot(redis_conn: Any = None) -> dict[str, Any]:
    """Every row of every model (sessions aside: a login writes one), and Redis's keys."""
    state: dict[str, Any] = {
        model._meta.label: list(model._default_manager.order_by("pk").values())
        for model in apps.get_models()
        if model is not Session
    }
    if redis_conn is not None:
        state["redis"] = sorted(
            (key, redis_conn.type(key), _size(redis_conn, key)) for key in redis_conn.keys("*")
        )
    return state


def _size(conn: Any, key: bytes) -> Any:
    kind = conn.type(key)
    if kind == b"list":
        return conn.llen(key)
    if kind == b"zset":
        return conn.zcard(key)
    if kind == b"set":
        return conn.scard(key)
    if kind == b"hash":
        return conn.hgetall(key)
    if kind == b"stream":
        return conn.xlen(key)
    return conn.get(key)


def _assert_unchanged(redis_conn: Any, before: dict[str, Any]) -> None:
    """The state is as `before`; if not, the message says which process wrote to Redis: an RQ
    job's description and the worker that took it, and who is connected to this database."""
    after = snapshot(redis_conn)
    if after == before:
        return
    fields = (b"description", b"origin", b"worker_name", b"enqueued_at", b"started_at")
    jobs = [
        {f.decode(): redis_conn.hget(key, f) for f in fields}
        for key, kind, _ in after.get("redis", [])
        if key.startswith(b"rq:job:") and kind == b"hash"
    ]
    clients = [(c["name"], c.get("db")) for c in redis_conn.client_list() if c.get("name")]
    assert after == before, {"jobs": jobs, "clients": clients}


def test_the_walk_covers_every_page_of_the_app(every_route):
    names = {r.name for r in every_route}
    # A few by name: the walk is the project's resolver, not a list that could go stale.
    for name in ("searches:search_pause", "searches:pack", "searches:search_charts", "logout"):
        assert name in names
    assert len([n for n in names if n.startswith("searches:")]) >= 22


def test_every_route_sends_an_anonymous_visitor_to_login(client, every_route):
    for route in every_route:
        response = client.get(route.url)
        if route.name in PUBLIC:
            assert response.status_code == 200, route
            continue
        assert response.status_code == 302, (route, response.status_code)
        assert response["Location"].startswith(LOGIN_PAGES), (route, response["Location"])


def test_static_files_and_the_login_page_need_no_login(client):
    assert client.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200
    assert client.get(reverse("login")).status_code == 200


def test_an_anonymous_post_anywhere_changes_nothing(client, every_route, redis_url):
    before = snapshot(redis_url)
    for route in every_route:
        if route.name in PUBLIC:
            continue
        response = client.post(route.url, {"title": "x", "text": "x", "body": "x"})
        assert response.status_code == 302, (route, response.status_code)
        assert response["Location"].startswith(LOGIN_PAGES), route
    _assert_unchanged(redis_url, before)


def test_every_post_without_a_csrf_token_is_refused(admin_engineer, every_route, redis_url):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_engineer)
    anonymous = Client(enforce_csrf_checks=True)
    before = snapshot(redis_url)
    for route in every_route:
        caller = anonymous if route.name in PUBLIC else strict
        response = caller.post(route.url, {"title": "x", "text": "x", "body": "x"})
        assert response.status_code == 403, (route, response.status_code)
        assert "CSRF verification failed" in response.content.decode(), route
    _assert_unchanged(redis_url, before)


def test_no_route_changes_anything_over_get(admin_engineer, every_route, redis_url):
    client = Client()
    client.force_login(admin_engineer)
    before = snapshot(redis_url)
    for route in every_route:
        client.get(route.url)
        client.get(route.url, headers={"HX-Request": "true"})
    _assert_unchanged(redis_url, before)


class _Forms(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.posts: list[list[str]] = []  # per <form method=post>: its input names
        self.open = False
        self.body_headers: str | None = None
        self.hx_posts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body_headers = a.get("hx-headers")
        if tag == "form" and (a.get("method") or "").lower() == "post":
            self.posts.append([])
            self.open = True
        if tag == "input" and self.open and self.posts:
            self.posts[-1].append(a.get("name") or "")
        if "hx-post" in a:
            self.hx_posts += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.open = False


def test_every_form_carries_the_token_and_htmx_sends_it_from_every_page(
    admin_engineer, every_route
):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_engineer)
    pages = forms = 0
    for route in every_route:
        response = client.get(route.url)
        if response.status_code != 200 or "text/html" not in response.get("Content-Type", ""):
            continue
        html = response.content.decode()
        parsed = _Forms()
        parsed.feed(html)
        for inputs in parsed.posts:
            assert "csrfmiddlewaretoken" in inputs, (route, inputs)
            forms += 1
        if route.admin or "<body" not in html:
            continue  # the admin's own pages post plain forms only; fragments have no body
        pages += 1
        # htmx adds these headers to every request it makes from the page (hx-post included).
        token = re.fullmatch(r'\{"X-CSRFToken": "(\w+)"\}', parsed.body_headers or "")
        assert token, (route, parsed.body_headers)
    assert pages >= 12 and forms >= 5, (pages, forms)


@pytest.mark.django_db
def test_a_403_logs_one_line_with_the_reason_not_a_traceback(outsider_client, caplog):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = outsider_client.get("/releases/")
    assert response.status_code == 403
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.exc_info is None and record.exc_text is None
    line = record.getMessage()
    assert line.startswith("Forbidden (Permission denied): /releases/") and "\n" not in line
    assert "engineer" in line.lower(), line  # the reason the view gave
