"""The access table of docs/deploy.md ("Who may do what") is what the server does.

One parametrised test walks the whole table: for every row and role it makes the request as a
user in that role and compares what happens with the cell. The cases are the table's rows
together with every route of Django's URL resolver (the library and the admin included) and of
autoweb/routing.py's websockets, so a route without a row fails, and so does a row naming a
route that no longer exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import URLPattern, get_resolver

from autoweb.routing import websocket_urlpatterns
from core.roles import ENGINEERS
from searches.models import Search
from tests.conftest import channel_layers, test_redis_url
from tests.web.conftest import _user
from tests.web.domain import propose
from tests.web.routes import _walk, routes

DEPLOY_DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
ROLES = ("anonymous", "no role", "engineer", "reviewer", "staff")
CELLS = {"yes", "no", "login", "own", "admin"}
ADMIN = "/admin/…"
# The admin's login (public) and logout (anyone signed in) have rows of their own.
ADMIN_OWN_ROWS = ("admin/login/", "admin/logout/")
ORIGIN = "http://localhost"


@dataclass(frozen=True)
class Row:
    path: str
    methods: tuple[str, ...]
    cells: dict[str, str]


def table() -> list[Row]:
    text = DEPLOY_DOC.read_text()
    start = text.index("### Who may do what")
    block = text[start : text.find("\n#", start + 1)]
    rows = []
    for line in block.splitlines():
        match = re.match(r"^\| `([^`]+)` \| ([A-Z, ]+) \|(.*)\|$", line)
        if not match:
            continue
        path, methods, rest = match.groups()
        cells = [c.strip() for c in rest.split("|")][: len(ROLES)]
        assert len(cells) == len(ROLES), line
        assert set(cells) <= CELLS, line
        rows.append(
            Row(
                path,
                tuple(m.strip() for m in methods.split(",")),
                dict(zip(ROLES, cells, strict=True)),
            )
        )
    return rows


def served() -> set[str]:
    """Every route, as the table writes it: "/" + the pattern; the admin's as one."""
    found = set()
    for _, _, full in _walk(get_resolver().url_patterns, (), ""):
        admin = full.startswith("admin/") and full not in ADMIN_OWN_ROWS
        found.add(ADMIN if admin else "/" + full)
    for pattern in websocket_urlpatterns:
        assert isinstance(pattern, URLPattern), pattern  # a nested router: walk it here
        found.add("/" + str(pattern.pattern))
    return found


def _cases() -> list[Any]:
    rows, routes_served = table(), served()
    cases = [
        pytest.param(
            row,
            role,
            id=f"{row.path} {'+'.join(row.methods)} {role}",
            # A socket's consumer reads the database from another thread: committed rows only.
            marks=pytest.mark.django_db(transaction=row.methods == ("WS",)),
        )
        for row in rows
        for role in ROLES
    ]
    in_table = {row.path for row in rows}
    cases += [
        pytest.param(path, None, id=f"{path} (no row)", marks=pytest.mark.django_db)
        for path in sorted(routes_served - in_table)
    ]
    return cases


# -- the requests ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Nobody here logs in with a password (force_login): six users need no real hashing."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def people(django_user_model, engineer, reviewer) -> dict[str, Any]:
    """A user per role; `engineer` owns the search the rows are tried on, `bob` does not."""
    return {
        "anonymous": None,
        "no role": _user(django_user_model, "mallory"),
        "engineer": engineer,
        "reviewer": reviewer,
        "staff": _user(django_user_model, "root", is_staff=True, is_superuser=True),
        "bob": _user(django_user_model, "bob", ENGINEERS),
    }


def _outcome(response: Any) -> str:
    location = response.get("Location", "") if response.status_code == 302 else ""
    if "/login/" in location and "next=" in location:
        return "login"
    if response.status_code == 403:
        return "no"
    if response.status_code == 405:
        return "405"
    return "yes"


def _request(url: str, method: str, user: Any) -> str:
    client = Client()
    if user is not None:
        client.force_login(user)
    if method == "GET":
        return _outcome(client.get(url))
    return _outcome(client.post(url, {}))


def _socket(url: str, user: Any) -> str:
    headers = [(b"origin", ORIGIN.encode())]
    if user is not None:
        client = Client()
        client.force_login(user)
        cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{django_settings.SESSION_COOKIE_NAME}={cookie}".encode()))

    async def connect() -> str:
        from autoweb.asgi import application

        ws = WebsocketCommunicator(application, url, headers=headers)
        ok, _ = await ws.connect(timeout=5)
        assert ok
        message = await ws.receive_output(timeout=5)
        await ws.disconnect()
        if message["type"] == "websocket.close":
            return {4401: "login", 4403: "no"}.get(message["code"], f"closed {message['code']}")
        return "yes"

    return async_to_sync(connect)()


def _url(path: str, samples: dict[str, Any]) -> str:
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(samples[m.group(1)]), path)


@pytest.fixture
def samples(search) -> dict[str, Any]:
    trial = propose(search, 1)
    return {
        "search": search,
        "trial": trial,
        "pk": search.pk,
        "index": trial.index,
        "search_id": search.pk,
        "kind": "model",
        "name": "softmax",
    }


def _sample_url(row: Row, samples: dict[str, Any]) -> str:
    values = dict(samples)
    if row.path.startswith("/ideas/"):
        values["pk"] = samples["search"].idea_id
    elif row.path.startswith("/reviews/trials/"):
        values["pk"] = samples["trial"].pk
    elif row.path.startswith("/packs/"):
        values["name"] = "deepseek-mla-sparse"
    return _url(row.path, values)


def _admin_urls(search: Search) -> list[str]:
    return [
        r.url
        for r in routes(
            {
                "app_label": "searches",
                "content_type_id": ContentType.objects.get_for_model(Search).pk,
                "object_id": search.pk,
            }
            | {p: 1 for p in ("pk", "index", "kind", "name", "search_id")}
        )
        if r.admin
    ]


@pytest.mark.usefixtures("redis_url")
@pytest.mark.parametrize(("row", "role"), _cases())
def test_the_access_table_is_what_the_server_does(row, role, people, samples, settings):
    assert isinstance(row, Row), f"{row} is served but has no row in docs/deploy.md's access table"
    assert row.path in served(), f"{row.path}: a row in the access table for no route"
    cell, user = row.cells[role], people[role]
    if row.path == ADMIN:
        urls = _admin_urls(samples["search"])
        assert len(urls) > 40
        for url in urls:
            if url.lstrip("/") in ADMIN_OWN_ROWS:
                continue
            for method in row.methods:
                got = _request(url, method, user)
                assert (got != "login") if cell == "admin" else got == cell, (url, method, got)
        return
    url = _sample_url(row, samples)
    if row.methods == ("WS",):
        settings.CHANNEL_LAYERS = channel_layers(
            settings.CHANNEL_LAYERS, test_redis_url(8), "autoweb-test-access-table"
        )
        assert _socket(url, user) == cell, url
        return
    for method in ("GET", "POST"):
        if method not in row.methods:
            # Another row may list it (a GET page with a POST action); otherwise it is refused.
            if not any(r.path == row.path and method in r.methods for r in table()):
                assert _request(url, method, people["staff"]) == "405", (url, method)
            continue
        if cell == "own":
            assert _request(url, method, user) == "yes", (url, method, "the owner")
            assert _request(url, method, people["bob"]) == "no", (url, method, "not the owner")
        elif role == "engineer":  # yes or no for every engineer: the owner and another one
            assert _request(url, method, user) == cell, (url, method, "the owner")
            assert _request(url, method, people["bob"]) == cell, (url, method, "not the owner")
        else:
            assert _request(url, method, user) == cell, (url, method)


def test_the_table_names_every_role_and_routes_of_every_kind():
    """The walk above could not pass on an empty or half-read table."""
    rows = table()
    assert len(rows) >= 30
    paths = {row.path for row in rows}
    assert {"/searches/<int:pk>/llm", "/releases/download", ADMIN} <= paths
    assert "/ws/searches/<int:search_id>/" in paths
    assert all(set(row.cells) == set(ROLES) for row in rows)
    assert any("own" in row.cells.values() for row in rows)
