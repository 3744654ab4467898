"""The Django-free GPU worker as a real process on real Redis (interpreter device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from kernels.protocol import CONFIRM_JOB, TABLE_JOB, events_key, queue_name, worker_key
from kernels.queues import QueueWorker, online_workers, register, rq_queue
from tests.conftest import test_redis_url
from tests.kernels.test_cli import OOM_PROBLEMS

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "kernels" / "seeds" / "softmax.py").read_text()
EXPLOIT = (ROOT / "tests" / "fixtures" / "exploits" / "library_fallback.py").read_text()


@pytest.fixture
def redis_url(worker_id):
    # One Redis database per xdist worker, emptied around the test.
    db = 11 + (int(worker_id[2:]) if worker_id.startswith("gw") else 0)
    url = test_redis_url(db)
    conn = redis.Redis.from_url(url)
    try:
        conn.ping()
    except redis.RedisError:
        pytest.skip(f"no Redis on {url}")
    conn.flushdb()
    yield url
    conn.flushdb()


def _run_worker(url: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "REDIS_URL": url, **(env or {})}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.worker",
            "--device",
            "interpret",
            "--burst",
            "--name",
            "test-host:interpret",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_it_evaluates_queued_jobs_and_streams_progress(redis_url):
    conn = redis.Redis.from_url(redis_url)
    q = rq_queue(queue_name("interpret"), conn)
    good = q.enqueue(
        "kernels.worker.evaluate_job",
        kwargs={"problem": "softmax", "source": SEED, "search_id": 7, "trial_id": 1},
    )
    bad = q.enqueue(
        "kernels.worker.evaluate_job",
        kwargs={"problem": "softmax", "source": EXPLOIT, "search_id": 7, "trial_id": 2},
    )
    unknown = q.enqueue(
        "kernels.worker.evaluate_job",
        kwargs={"problem": "nope", "source": SEED, "search_id": 7, "trial_id": 3},
    )
    proc = _run_worker(redis_url)
    assert proc.returncode == 0, proc.stderr[-2000:]

    good.refresh()
    report = good.return_value()
    assert report["verdict"] == "accepted"
    assert report["device"]["kind"] == "interpret"
    assert report["worker"] == "test-host:interpret"
    bad_report = bad.return_value()
    assert bad_report["failure"] == "prohibited"
    assert "library fallback" in " ".join(bad_report["reasons"])
    assert unknown.return_value()["failure"] == "malformed"

    events = [json.loads(f[b"data"]) for _, f in conn.xrange(events_key(7))]
    phases = [(e["trial"], e["phase"]) for e in events]
    assert (1, "compiling") in phases and (1, "verifying") in phases
    assert any(e.get("of") == 4 for e in events if e["trial"] == 1)
    # a worker that exits deregisters
    assert conn.get(worker_key("test-host:interpret")) is None


def test_it_runs_retime_and_table_jobs_and_refuses_an_unknown_problem(redis_url):
    conn = redis.Redis.from_url(redis_url)
    q = rq_queue(queue_name("interpret"), conn)
    kw = {"sources": [SEED, SEED], "tier": "smoke", "search_id": 7}
    confirm = q.enqueue(CONFIRM_JOB, kwargs={"problem": "softmax", "trial_id": 1, **kw})
    table = q.enqueue(TABLE_JOB, kwargs={"problem": "softmax", **kw})
    unknown = q.enqueue(CONFIRM_JOB, kwargs={"problem": "nope", "trial_id": 2, **kw})
    proc = _run_worker(redis_url)
    assert proc.returncode == 0, proc.stderr[-2000:]

    # The interpreter times nothing: both sources come back correct and untimed.
    numbers = confirm.return_value()
    assert [n["geomean_ms"] for n in numbers] == [None, None], numbers
    together = table.return_value()
    assert together["verdict"] == "accepted", together["reasons"]
    assert len(together["kernels"]) == 2 and len(together["labels"]) == 4
    assert "nope" in unknown.return_value()["error"]


def test_a_problem_that_fails_on_its_own_is_reported_as_the_problems_fault(redis_url, tmp_path):
    from tests.kernels.test_bad_input import BROKEN
    from tests.kernels.test_cli import CANDIDATE, ROWSCALE

    old, new, message = BROKEN["inputs"]
    (tmp_path / "flaky.py").write_text(ROWSCALE.replace(old, new))
    conn = redis.Redis.from_url(redis_url)
    q = rq_queue(queue_name("interpret"), conn)
    source = CANDIDATE.replace("FACTOR", "2.0")
    kw = {"problem": "flaky", "search_id": 7}
    evaluated = q.enqueue("kernels.worker.evaluate_job", kwargs={**kw, "source": source})
    proc = _run_worker(redis_url, env={"AUTOWEB_PROBLEM_DIRS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]

    report = evaluated.return_value()
    assert report["verdict"] == "rejected" and report["failure"] == "malformed"
    (reason,) = report["reasons"]
    assert f"problem 'flaky' fails on M=3,N=5000: {message}" in reason
    assert "the candidate was not judged" in reason


def test_a_job_the_harness_cannot_check_fails_as_a_job_never_as_a_verdict(redis_url):
    # The worker's own process out of memory for every reference: the job fails
    # (HarnessFault), so the orchestrator runs it again like a lost job; no report rejects the
    # candidate.
    conn = redis.Redis.from_url(redis_url)
    q = rq_queue(queue_name("interpret"), conn)
    job = q.enqueue(
        "kernels.worker.evaluate_job",
        kwargs={"problem": "softmax_oom", "source": SEED, "search_id": 9},
    )
    proc = _run_worker(redis_url, env={"AUTOWEB_PROBLEM_DIRS": str(OOM_PROBLEMS)})
    assert proc.returncode == 0, proc.stderr[-2000:]

    assert job.get_status(refresh=True) == "failed"
    assert job.return_value() is None
    exc = job.latest_result().exc_string
    assert "HarnessFault" in exc and "the candidate was not judged" in exc


def test_online_workers_are_those_with_a_live_heartbeat(redis_url):
    conn = redis.Redis.from_url(redis_url)
    register(conn, "a:gpu0", {"kind": "h200", "queue": "gpu.h200"})
    register(conn, "b:gpu1", {"kind": "h200", "queue": "gpu.h200"})
    conn.delete(worker_key("b:gpu1"))  # its heartbeat expired
    names = [w["name"] for w in online_workers(conn)]
    assert names == ["a:gpu0"]
    assert conn.smembers("autoweb:workers") == {b"a:gpu0"}


def test_a_bad_device_flag_is_a_usage_error(redis_url):
    env = {**os.environ, "REDIS_URL": redis_url}
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.worker", "--device", "tpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr


def test_the_heartbeat_names_the_job_being_evaluated(redis_url):
    # The orchestrator retries a started job that no live heartbeat names: a long evaluation
    # must be named, or it would be run again while it still runs.
    conn = redis.Redis.from_url(redis_url)
    hang = (ROOT / "tests" / "fixtures" / "exploits" / "hang.py").read_text()
    job = rq_queue(queue_name("interpret"), conn).enqueue(
        "kernels.worker.evaluate_job",
        kwargs={"problem": "softmax", "source": hang, "timeout_s": 20},
    )
    env = {**os.environ, "REDIS_URL": redis_url}
    cmd = [sys.executable, "-m", "kernels.worker", "--device", "interpret", "--burst"]
    proc = subprocess.Popen([*cmd, "--name", "beat:interpret"], cwd=ROOT, env=env)
    named = []
    try:
        while proc.poll() is None:
            raw = conn.get(worker_key("beat:interpret"))
            if raw is not None and json.loads(raw).get("job") == job.id:
                named.append(job.get_status(refresh=True))
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=30)

    assert "started" in named, "no heartbeat named the running job"
    assert job.return_value()["failure"] == "timeout"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("eight", "AUTOWEB_GPU_SLOTS must be a whole number, got 'eight'"),
        ("0", "AUTOWEB_GPU_SLOTS must be at least 1, got 0"),
        ("-2", "AUTOWEB_GPU_SLOTS must be at least 1, got -2"),
    ],
)
def test_a_bad_gpu_slots_setting_is_a_usage_error(redis_url, raw: str, message: str):
    proc = _run_worker(redis_url, env={"AUTOWEB_GPU_SLOTS": raw})

    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not redis.Redis.from_url(redis_url).smembers("autoweb:workers")  # never registered


def test_serve_starts_a_fresh_rq_worker_once_redis_answers_again(redis_url):
    # RQ raises ConnectionError from its own bookkeeping when Redis goes away mid-job; the
    # process (GPU worker or orchestrator) must go on with a new RQ worker, not end.
    from kernels import queues

    conn = redis.Redis.from_url(redis_url)
    started, resumed = [], []

    class Cut:  # an RQ worker whose Redis went away under it the first time
        def __init__(self, attempt: int) -> None:
            self.attempt = attempt

        def work(self, burst: bool, with_scheduler: bool) -> None:
            started.append(self.attempt)
            if self.attempt == 0:
                raise redis.ConnectionError("Error 111 connecting to 127.0.0.1. Refused.")

    queues.serve(Cut, conn, burst=True, name="test", on_reconnect=lambda: resumed.append(1))

    assert started == [0, 1] and resumed == [1]


def test_a_queue_worker_stops_at_once_when_its_listener_read_the_unsubscribe_first(redis_url):
    """RQ listens for its commands on a thread; at its end it unsubscribes and then stops that
    thread, and redis-py (8.2 on) waits for the thread to end. Here the listener reads the
    unsubscribe reply and goes back to waiting before the stop comes, the order that made a
    worker or the orchestrator take a minute to exit while RQ's wait was 60 s."""
    conn = redis.Redis.from_url(redis_url)
    worker = QueueWorker([rq_queue("stop-at-once", conn)], connection=conn, name="stop-at-once")
    worker.subscribe()
    pubsub, thread = worker.pubsub, worker.pubsub_thread
    sent = pubsub.unsubscribe

    def unsubscribe_then_let_the_listener_read_the_reply(*args, **kwargs):
        out = sent(*args, **kwargs)
        deadline = time.monotonic() + 5
        while pubsub.subscribed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not pubsub.subscribed, "the listener never read the unsubscribe reply"
        time.sleep(0.3)  # back in its wait, if it is still running
        return out

    pubsub.unsubscribe = unsubscribe_then_let_the_listener_read_the_reply
    start = time.monotonic()
    worker.unsubscribe()
    took = time.monotonic() - start
    assert not thread.is_alive()
    assert took < 10, f"unsubscribing took {took:.1f} s: the listener sat out its wait"


def test_a_queue_worker_unsubscribes_before_its_listener_closes_the_connection(redis_url):
    """A burst worker with nothing to do subscribes and unsubscribes within milliseconds. The
    listener must not end, and close the connection, before the unsubscribe is sent: a write to
    the closed socket raised ConnectionError from the worker's teardown, and `serve` took that
    for Redis going away and started another worker."""
    conn = redis.Redis.from_url(redis_url)
    for i in range(5):
        worker = QueueWorker([rq_queue("stop-at-once", conn)], connection=conn, name=f"quick-{i}")
        worker.subscribe()
        pubsub, thread = worker.pubsub, worker.pubsub_thread
        sent, alive = pubsub.unsubscribe, []

        def unsubscribe_once_the_listener_had_its_chance(*args, _s=sent, _t=thread, _a=alive, **kw):
            time.sleep(0.3)  # long enough for a listener that would end to end
            _a.append(_t.is_alive())
            return _s(*args, **kw)

        pubsub.unsubscribe = unsubscribe_once_the_listener_had_its_chance
        worker.unsubscribe()
        assert alive == [True], "the listener ended before the unsubscribe was sent"
        assert not thread.is_alive()


def test_serve_ends_the_listener_of_a_worker_whose_redis_went_away(redis_url):
    # A worker whose teardown could not reach Redis never stopped its command listener, which
    # went on retrying, then listened on a dead worker's channel once Redis was back.
    from kernels import queues

    conn = redis.Redis.from_url(redis_url)
    made = []

    class CutAfterSubscribing(QueueWorker):
        def work(self, burst: bool, with_scheduler: bool) -> None:
            made.append(self)
            if len(made) == 1:
                self.subscribe()
                raise redis.ConnectionError("Error 104 while reading from the socket.")

    def make(attempt: int) -> QueueWorker:
        return CutAfterSubscribing([rq_queue("cut", conn)], connection=conn, name=f"cut-{attempt}")

    queues.serve(make, conn, burst=True, name="test")
    assert len(made) == 2
    listener = made[0].pubsub_thread
    listener.join(timeout=10)
    assert not listener.is_alive(), "the first worker's listener outlived it"


SERVE_WHILE_REDIS_IS_AWAY = """
import redis, sys
from kernels.queues import QueueWorker, rq_queue, serve

away = redis.Redis(port=int(sys.argv[1]), socket_connect_timeout=1)  # nothing listens there
conn = redis.Redis.from_url(sys.argv[2])  # the RQ worker is made on a Redis that answers

class Cut(QueueWorker):
    def work(self, burst, with_scheduler):
        self._install_signal_handlers()  # as RQ's work() does first
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1. Connection refused.")

serve(lambda a: Cut([rq_queue("q", conn)], connection=conn, name=f"cut-{a}"), away,
      burst=False, name="test")
print("serve returned", flush=True)
"""


def test_a_stop_signal_ends_serve_while_it_waits_for_redis(redis_url, tmp_path):
    """SIGTERM (a deploy's stop, `manage.py up` going down) while the worker waits for Redis to
    come back: it stops, with exit code 0, instead of dying on RQ's handler of a worker that
    had already ended (a traceback, exit code 1) or waiting on."""
    import signal
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE_WHILE_REDIS_IS_AWAY, str(port), redis_url],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "reconnecting" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == 0, text
    assert "stopped while waiting for Redis" in text and "serve returned" in text, text
