"""The two Redis users of docs/deploy.md, read from that page into a private redis-server's ACL
file: the orchestrator runs a search as `autoweb` while a GPU worker logged in as `gpu` serves
it, and `gpu` can use every key a worker writes (heartbeats, progress events, the baseline cache)
but not the channel layer's keys or the search leases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from kernels.harness.baselines import BaselineCache, digest
from kernels.protocol import (
    KINDS_SEEN_KEY,
    WORKERS_KEY,
    baselines_key,
    events_key,
    worker_key,
)
from searches.models import Search
from searches.orchestrator import lease_key, pending_key
from tests.web.processes import Processes, RedisServer
from tests.web.test_search_e2e import _search, _wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DEPLOY_DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def documented_acl() -> list[str]:
    """The `user ...` lines of the ACL file block in docs/deploy.md, as an operator copies them."""
    text = DEPLOY_DOC.read_text()
    block = text.split("Two users in `/etc/redis/users.acl`", 1)[1].split("```", 2)[1]
    lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("user ")]
    assert {ln.split()[1] for ln in lines} == {"default", "autoweb", "gpu"}, lines
    return lines


@pytest.fixture
def acl_redis(tmp_path):
    acl = tmp_path / "users.acl"
    acl.write_text("\n".join(documented_acl()) + "\n")
    server = RedisServer(tmp_path, "--aclfile", str(acl))
    server.start()
    base = f"127.0.0.1:{server.port}/0"
    yield {
        "web": f"redis://autoweb:WEB-PASSWORD@{base}",
        "gpu": f"redis://gpu:GPU-PASSWORD@{base}",
        "anonymous": f"redis://{base}",
    }
    server.kill()


def test_a_worker_logged_in_as_gpu_serves_a_search_run_as_autoweb(acl_redis, settings, tmp_path):
    search = _search(settings, acl_redis["web"], max_trials=2)
    (tmp_path / "web").mkdir()
    (tmp_path / "gpu").mkdir()
    web = Processes(acl_redis["web"], tmp_path / "web")
    gpu = Processes(acl_redis["gpu"], tmp_path / "gpu")
    try:
        worker = gpu.start("-m", "kernels.worker", "--device", "interpret", "--name", "acl:w")
        web.start("manage.py", "orchestrator")
        try:
            search = _wait(search, lambda s: s.status == Search.Status.FINISHED, timeout=360)
        except AssertionError:
            raise AssertionError(gpu.log_tails() + web.log_tails()) from None
        assert worker.poll() is None, gpu.log_tails()
        logs = gpu.log_tails(10**6) + web.log_tails(10**6)
        assert "NOPERM" not in logs and "NoPermission" not in logs, logs
        assert all(t.terminal and t.report for t in search.trials.all())
        conn = redis.Redis.from_url(acl_redis["web"])
        assert conn.sismember(WORKERS_KEY, "acl:w")
        assert conn.exists(worker_key("acl:w"))
        assert conn.hget(KINDS_SEEN_KEY, "interpret") is not None
        assert conn.xlen(events_key(search.pk)) > 0, "the worker's progress events"
    finally:
        gpu.stop_all()
        web.stop_all()


def test_the_gpu_user_shares_baselines_but_not_the_channel_layer_or_the_leases(acl_redis, tmp_path):
    gpu = redis.Redis.from_url(acl_redis["gpu"])
    fields = {"problem": "softmax", "kind": "h200", "torch": "x", "triton": "y"}
    entry = {"eager": {"median": 1.0}, "compiled": {"median": 0.5}, "mode": "graph"}
    BaselineCache(tmp_path / "a", redis=gpu).put(fields, ["n=1"], [entry])
    assert gpu.exists(baselines_key(digest(fields)))
    # Another host (an empty disk cache) reads what the first measured, through Redis.
    got = BaselineCache(tmp_path / "b", redis=gpu).get(fields, ["n=1"])
    assert got and got[0]["eager"]["median"] == 1.0

    for key in ("asgi:group:search-1", lease_key(1), pending_key(1)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            gpu.set(key, json.dumps({"planted": True}))
    with pytest.raises(redis.exceptions.NoPermissionError):
        gpu.publish("asgi:search-1", "planted")
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(acl_redis["anonymous"]).ping()
    # What the ACL does not stop (docs/deploy.md says so): RQ keeps every queue under `rq:`.
    assert gpu.rpush("rq:queue:search", "x") == 1
