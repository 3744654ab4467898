"""Suite-wide hooks. Django is configured by pytest-django from pyproject.toml
(DJANGO_SETTINGS_MODULE); setting DATABASE_URL switches the test database to PostgreSQL."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch  # only when a gpu test was collected: importing torch costs seconds

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


# The Redis server the suite uses: AUTOWEB_TEST_REDIS=host:port lets two checkouts run their suites
# side by side, each against its own server; databases within it are chosen per module and worker.
TEST_REDIS = os.environ.get("AUTOWEB_TEST_REDIS", "127.0.0.1:6379")


def test_redis_url(db: int) -> str:
    return f"redis://{TEST_REDIS}/{db}"


test_redis_url.__test__ = False  # a helper, not a test


def channel_layers(configured: dict, url: str, prefix: str) -> dict:
    """The project's channel layer, with its options (capacity, socket timeout...), on the test
    Redis at `url` under `prefix`."""
    default = configured["default"]
    config = default["CONFIG"]
    host = {**config["hosts"][0], "address": url}
    return {"default": {**default, "CONFIG": {**config, "hosts": [host], "prefix": prefix}}}


channel_layers.__test__ = False
