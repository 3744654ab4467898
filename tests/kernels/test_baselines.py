"""The baseline cache (kernels.harness.baselines): kept on disk and in Redis by key, ignored
when measured under other versions, and measured again when the drift canary moves."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis

from kernels import problems
from kernels.harness import baselines as bl
from tests.conftest import test_redis_url

DEVICE = {
    "kind": "h200",
    "name": "NVIDIA H200",
    "versions": {"torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0", "driver": "580.1"},
}
LABELS = ["M=1,N=4096", "M=4096,N=4096", "M=65536,N=4096"]


def entry(ms: float, spread: float = 0.01, mode: str = "events") -> dict:
    stats = {"median": ms, "spread": spread, "n": 25}
    return {"eager": stats, "compiled": {"median": ms * 0.8, "spread": spread}, "mode": mode}


ENTRIES = [entry(0.004, mode="graph"), entry(0.05), entry(0.8)]


@pytest.fixture
def fields() -> dict:
    return bl.key_fields(problems.load("softmax"), DEVICE, "bfloat16")


def test_entries_survive_a_new_process_through_the_disk(tmp_path: Path, fields: dict) -> None:
    bl.BaselineCache(tmp_path).put(fields, LABELS, ENTRIES)

    again = bl.BaselineCache(tmp_path).get(fields, LABELS)

    assert again is not None
    assert [e["eager"]["median"] for e in again] == [0.004, 0.05, 0.8]
    assert all(e["measured_at"] for e in again)
    assert bl.BaselineCache(tmp_path).get(fields, [*LABELS, "M=7,N=7"]) is None  # one missing


def test_the_key_changes_with_the_versions_and_the_problem_source(fields: dict) -> None:
    newer = {**DEVICE, "versions": {**DEVICE["versions"], "torch": "2.12.0"}}

    assert bl.digest(fields) != bl.digest(
        bl.key_fields(problems.load("softmax"), newer, "bfloat16")
    )
    assert bl.digest(fields) != bl.digest(
        bl.key_fields(problems.load("rmsnorm"), DEVICE, "bfloat16")
    )
    assert bl.digest(fields) != bl.digest(
        bl.key_fields(problems.load("softmax"), DEVICE, "float16")
    )
    assert len(fields["problem_sha256"]) == 64


def test_a_cache_file_from_another_torch_version_is_ignored_and_said_so(
    tmp_path: Path, fields: dict
) -> None:
    cache = bl.BaselineCache(tmp_path)
    cache.put(fields, LABELS, ENTRIES)
    path = next(tmp_path.glob("softmax-h200-*.json"))
    data = json.loads(path.read_text())
    data["fields"]["torch"] = "2.4.0"  # e.g. copied over from a host with an older torch
    path.write_text(json.dumps(data))

    fresh = bl.BaselineCache(tmp_path)

    assert fresh.get(fields, LABELS) is None
    assert fresh.ignored == [f"{path.name}: measured under other torch; ignored"]


def test_a_garbled_cache_file_is_ignored(tmp_path: Path, fields: dict) -> None:
    cache = bl.BaselineCache(tmp_path)
    cache.put(fields, LABELS, ENTRIES)
    path = next(tmp_path.glob("softmax-h200-*.json"))
    path.write_text("{not json")

    fresh = bl.BaselineCache(tmp_path)

    assert fresh.get(fields, LABELS) is None
    assert "unreadable" in fresh.ignored[0]


def test_other_workers_of_the_kind_share_the_entries_through_redis(
    tmp_path: Path, fields: dict
) -> None:
    conn = redis.Redis.from_url(test_redis_url(15))
    try:
        conn.ping()
    except redis.RedisError:
        pytest.skip("no Redis for the test suite")
    conn.delete(f"autoweb:baselines:{bl.digest(fields)}")
    bl.BaselineCache(tmp_path / "host-a", redis=conn).put(fields, LABELS, ENTRIES)

    other_host = bl.BaselineCache(tmp_path / "host-b", redis=conn)

    got = other_host.get(fields, LABELS)
    assert got is not None and got[2]["eager"]["median"] == 0.8
    other_host.drop(fields)
    assert conn.get(f"autoweb:baselines:{bl.digest(fields)}") is None
    assert bl.BaselineCache(tmp_path / "host-c", redis=conn).get(fields, LABELS) is None


@pytest.mark.parametrize(
    ("now", "moved"),
    [
        ({"median": 0.0505, "spread": 0.01}, False),  # 1%: inside the 3% floor
        ({"median": 0.0540, "spread": 0.01}, True),  # 8%: beyond the floor and both spreads
        ({"median": 0.0540, "spread": 0.2}, False),  # 8%, but the canary is too noisy to tell
        ({"median": 0.0450, "spread": 0.01}, True),  # faster counts too
        (None, True),  # nothing measured: nothing to trust
    ],
)
def test_drift_is_a_move_beyond_both_spreads_and_the_floor(now, moved: bool) -> None:
    assert bl.drifted({"median": 0.05, "spread": 0.01}, now)[0] is moved


def test_a_drifting_canary_drops_the_key_and_measures_again(tmp_path: Path, fields: dict) -> None:
    cache = bl.BaselineCache(tmp_path)
    cache.put(fields, LABELS, ENTRIES)
    canary = bl.canary_index(ENTRIES)
    calls = []

    def remeasure() -> list[dict]:
        calls.append(1)
        return [entry(0.0045, mode="graph"), entry(0.056), entry(0.9)]

    steady, info = bl.settle_canary(
        cache, fields, LABELS, ENTRIES, canary, {"median": 0.0502, "spread": 0.01}, remeasure
    )
    assert steady is ENTRIES and calls == []
    assert info["canary"]["drift"] is False

    placed, info = bl.settle_canary(
        cache, fields, LABELS, ENTRIES, canary, {"median": 0.056, "spread": 0.01}, remeasure
    )

    assert calls == [1]
    assert info["source"] == "re-measured after drift"
    assert info["canary"] == {
        "shape": LABELS[canary],
        "cached_ms": 0.05,
        "now_ms": 0.056,
        "ratio": pytest.approx(1.12),
        "drift": True,
    }
    assert [e["eager"]["median"] for e in placed] == [0.0045, 0.056, 0.9]
    stored = bl.BaselineCache(tmp_path).get(fields, LABELS)
    assert [e["eager"]["median"] for e in stored] == [0.0045, 0.056, 0.9]


def test_the_canary_is_the_shape_with_the_median_eager_time() -> None:
    assert bl.canary_index(ENTRIES) == 1
    assert bl.canary_index([entry(3.0), entry(0.1), entry(0.2), entry(9.0)]) == 0  # upper median


def test_a_missing_key_is_measured_once_when_several_threads_need_it(
    tmp_path: Path, fields: dict
) -> None:
    cache = bl.BaselineCache(tmp_path)
    measured = []

    def need() -> None:
        if cache.get(fields, LABELS) is not None:
            return
        with cache.lock(fields):
            if cache.get(fields, LABELS) is None:
                time.sleep(0.2)
                measured.append(1)
                cache.put(fields, LABELS, ENTRIES)

    threads = [threading.Thread(target=need) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert measured == [1]
