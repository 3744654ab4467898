"""Fixtures for the web app's tests: users in each role, an idea, searches."""

from __future__ import annotations

from typing import Any

import pytest

from searches import services
from searches.models import Search
from searches.roles import ENGINEERS, REVIEWERS
from tests.web.domain import idea_kwargs


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
