"""The sandbox, with real processes: isolation, killing, the warm pool."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kernels.harness import evaluate
from kernels.harness.sandbox import GRACE_S, Child, Pool, network_isolation_available

ROOT = Path(__file__).resolve().parents[2]

EXPLOITS = Path(__file__).resolve().parents[1] / "fixtures" / "exploits"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def _gone(pid: int, create_time: float) -> bool:
    """Dead, reaped, or a zombie waiting for a reaper that is not us; never a reused pid."""
    try:
        p = psutil.Process(pid)
        return p.create_time() != create_time or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for(pred, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


SECRET = ("AUTOWEB_TEST_SECRET_TOKEN", f"s3cret-{uuid.uuid4().hex}")


@pytest.fixture(scope="module")
def child() -> Iterator[Child]:
    """One warm child for the tests that only look at it (starting one takes seconds)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(*SECRET)
        c = Child("interpret")
        try:
            c.wait_ready()
            yield c
        finally:
            c.close()


def test_a_child_does_not_inherit_the_callers_environment(child: Child) -> None:
    name, value = SECRET
    env = _environ(child.proc.pid)

    assert name not in env
    assert not any(value in v for v in env.values())
    assert env["TRITON_INTERPRET"] == "1"


def test_a_child_has_its_own_caches_and_home_inside_its_directory(child: Child) -> None:
    env = _environ(child.proc.pid)

    root = child.dir.resolve()
    for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HOME", "TMPDIR"):
        path = Path(env[key]).resolve()
        assert root in path.parents, (key, path, root)
        assert path.is_dir()
    assert Path(f"/proc/{child.proc.pid}/cwd").resolve() == root / "tmp"


def test_a_child_has_no_network_namespace_in_common_with_the_caller(child: Child) -> None:
    if not network_isolation_available():
        pytest.skip("unshare -n is not permitted here: children share the network")

    theirs = os.readlink(f"/proc/{child.proc.pid}/ns/net")

    assert theirs != os.readlink("/proc/self/ns/net")


def test_a_child_runs_in_its_own_session_and_process_group(child: Child) -> None:
    pid = child.proc.pid

    assert os.getsid(pid) == pid
    assert os.getpgid(pid) == pid
    assert os.getsid(pid) != os.getsid(0)


def test_a_child_has_its_resource_limits_set(child: Child) -> None:
    limits = psutil.Process(child.proc.pid).rlimit

    assert limits(psutil.RLIMIT_AS)[0] == child.memory_bytes
    assert limits(psutil.RLIMIT_CORE) == (0, 0)
    assert limits(psutil.RLIMIT_NOFILE)[0] == 4096


def test_the_caller_reads_the_childs_cpu_time_itself() -> None:
    c = Child("interpret")
    try:
        c.wait_ready()
        ready = c.cpu_seconds()
        t = psutil.Process(c.proc.pid).cpu_times()

        # Read from /proc, not reported by the child: its start-up (importing torch) shows.
        assert ready is not None and ready >= t.user + t.system - 0.01 > 0
    finally:
        c.close()

    assert c.cpu_seconds() is None  # gone


def test_close_kills_the_child_and_removes_its_directory() -> None:
    c = Child("interpret")
    try:
        c.wait_ready()
        pid = c.proc.pid
        started = psutil.Process(pid).create_time()
        assert c.dir.is_dir()
    finally:
        c.close()

    assert c.proc.poll() is not None
    assert _gone(pid, started)
    assert not c.dir.exists()


def test_close_kills_every_process_the_child_started() -> None:
    # A wrapper leaves a grandchild behind in the child's process group.
    c = Child("interpret", wrapper=["sh", "-c", 'sleep 600 & exec "$@"', "sh"])
    try:
        c.wait_ready()
        tree = psutil.Process(c.proc.pid).children(recursive=True)
        assert any(p.name() == "sleep" for p in tree), tree
        born = {p.pid: p.create_time() for p in tree}
    finally:
        c.close()

    assert all(_gone(pid, t) for pid, t in born.items())


def test_a_hanging_candidate_is_killed_with_its_whole_process_tree() -> None:
    me = psutil.Process()
    seen: dict[int, tuple[float, str]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    seen.setdefault(p.pid, (p.create_time(), p.cwd()))
            time.sleep(0.2)

    # A started child, as a worker's pool keeps: the bound is on the candidate's time, not on
    # starting Python and torch (which took 5-25 s on a loaded 2-core machine).
    pool = Pool("interpret", size=1)
    for c in list(pool._idle):
        c.wait_ready()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        report = evaluate(
            "softmax",
            (EXPLOITS / "hang.py").read_text(),
            device="interpret",
            timeout_s=10,
            pool=pool,
        )
    finally:
        elapsed = time.monotonic() - started
        stop.set()
        watcher.join()
        pool.close()

    assert report["failure"] == "timeout", report["reasons"]
    assert elapsed < 10 + GRACE_S + 5  # timeout, the kill's grace, reading the report
    sandbox_dir = report["sandbox_dir"]
    tree = {pid: t for pid, (t, cwd) in seen.items() if cwd.startswith(sandbox_dir)}
    assert tree, "the watcher never saw the sandboxed process"
    assert all(_gone(pid, t) for pid, t in tree.items())
    assert not Path(sandbox_dir).exists()
    for p in psutil.process_iter():
        try:
            cwd = p.cwd()
        except psutil.Error:
            continue
        assert not cwd.startswith(sandbox_dir), f"pid {p.pid} survived in {cwd}"


SLOW_TO_LOAD = """
import torch

n = 0
while True:  # a module that never finishes loading, like a compile that never ends
    n += 1


def kernel(x):
    return torch.empty_like(x)
"""


def test_a_candidate_that_does_not_finish_compiling_is_stopped_at_the_compile_budget() -> None:
    pool = Pool("interpret", size=1)
    for c in list(pool._idle):
        c.wait_ready()
    started = time.monotonic()
    try:
        report = evaluate(
            "softmax", SLOW_TO_LOAD, device="interpret", compile_timeout_s=3, pool=pool
        )
    finally:
        elapsed = time.monotonic() - started
        pool.close()

    assert report["failure"] == "timeout", report["reasons"]
    assert "compiling took over 3 s (the compile budget)" in report["reasons"][0]
    assert elapsed < 3 + GRACE_S + 5  # not the 300 s of the whole evaluation's deadline


def test_the_pool_hands_out_each_child_once_and_refills() -> None:
    pool = Pool("interpret", size=2)
    taken: list[Child] = []
    try:
        warm = [c.proc.pid for c in pool._idle]
        assert len(set(warm)) == 2

        taken = [pool.acquire() for _ in range(3)]
        pids = [c.proc.pid for c in taken]

        assert len(set(pids)) == 3
        assert pids[:2] == warm  # the warm ones first
        assert _wait_for(lambda: len(pool._idle) == 2, 120), "the pool did not refill"
        refilled = {c.proc.pid for c in pool._idle}
        assert not refilled & set(pids)
        for c in pool._idle:
            c.wait_ready()
        taken[0].wait_ready()
        assert taken[0].ready
    finally:
        for c in taken:
            c.close()
        pool.close()
    assert all(c.proc.poll() is not None for c in taken)


def test_a_pool_started_with_more_keeps_only_its_size_idle_after() -> None:
    # Three start at once for a caller that begins three evaluations together; once they are
    # taken, one is kept idle, not three: the first two taken start no replacement.
    pool = Pool("interpret", size=1, first=3)
    taken: list[Child] = []
    try:
        assert len(pool._idle) == pool.first == 3
        taken = [pool.acquire() for _ in range(2)]
        time.sleep(1.0)  # a replacement would have been started by now
        assert len(pool._idle) == 1
        taken.append(pool.acquire())
        assert _wait_for(lambda: len(pool._idle) == 1, 120), "the pool did not refill to 1"
        time.sleep(1.0)
        assert len(pool._idle) == 1  # to its size, not to `first`
    finally:
        for c in taken:
            c.close()
        pool.close()


def test_the_pool_replaces_a_warm_child_that_died() -> None:
    pool = Pool("interpret", size=1)
    got = None
    try:
        dead = pool._idle[0]
        dead.kill()

        got = pool.acquire()

        assert got is not dead
        assert got.proc.poll() is None
        assert not dead.dir.exists()
    finally:
        if got is not None:
            got.close()
        pool.close()
