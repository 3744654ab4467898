"""The web fixtures (users in each role, an idea, searches, Redis) for the library's tests."""

from __future__ import annotations

from tests.web.conftest import *  # noqa: F403 - fixtures are found by name
