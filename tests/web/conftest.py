"""Fixtures for the web app's tests: users in each role, an idea, searches, Redis, real
processes."""

from __future__ import annotations

from typing import Any

import pytest

from core.roles import ENGINEERS, REVIEWERS
from searches import services
from searches.models import Search
from tests.conftest import test_redis_url
from tests.web.agent_helpers import llm_server  # noqa: F401 (a fixture: the LLM endpoint)
from tests.web.domain import idea_kwargs
from tests.web.processes import Processes


def _user(django_user_model: Any, username: str, *groups: str, **extra: Any) -> Any:
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user(username=username, password="pw-42-long!", **extra)
    for name in groups:
        # get_or_create: a transactional test flushes the groups migration 0002 made.
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


@pytest.fixture
def engineer(django_user_model):
    return _user(django_user_model, "ada", ENGINEERS)


@pytest.fixture
def reviewer(django_user_model):
    return _user(django_user_model, "grace", REVIEWERS)


@pytest.fixture
def outsider(django_user_model):
    """Logged in, but in no role."""
    return _user(django_user_model, "mallory")


@pytest.fixture
def idea(engineer):
    return services.create_idea(**idea_kwargs(engineer))


@pytest.fixture
def queued_search(idea, engineer) -> Search:
    return services.start_search(idea=idea, user=engineer, seed=7)


@pytest.fixture
def search(queued_search) -> Search:
    """A running search."""
    return services.begin_search(search=queued_search)


# -- pages: Redis, clients, trials -------------------------------------------------------------


@pytest.fixture
def redis_url(settings, worker_id):
    """settings.REDIS_URL on a Redis database of its own (9, 10... per xdist worker), flushed."""
    import redis

    db = 9 + (int(worker_id[2:]) if worker_id.startswith("gw") else 0)
    url = test_redis_url(db)
    conn = redis.Redis.from_url(url)
    try:
        conn.ping()
    except redis.RedisError:
        pytest.skip(f"no Redis on {url}")
    conn.flushdb()
    settings.REDIS_URL = url
    yield conn
    conn.flushdb()
    conn.close()


@pytest.fixture
def env(redis_url, settings, tmp_path):
    """Real processes (`Processes`: the orchestrator, GPU workers) on the test's database and its
    Redis database (`redis_url`), all killed at the end: {"redis", "url", "procs", "start"}.
    Extra environment for them goes into `procs.env` before the first start."""
    procs = Processes(settings.REDIS_URL, tmp_path)
    yield {"redis": redis_url, "url": settings.REDIS_URL, "procs": procs, "start": procs.start}
    procs.stop_all()


@pytest.fixture
def dead_redis(settings):
    """settings.REDIS_URL pointing at a port nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    return settings.REDIS_URL


@pytest.fixture
def engineer_client(client, engineer):
    client.force_login(engineer)
    return client


@pytest.fixture
def outsider_client(client, outsider):
    client.force_login(outsider)
    return client
