"""RQ queues and worker records in Redis, as both sides use them: torch-free and Django-free.

The web side (the orchestrator, the library app, the GPU page) enqueues jobs and reads worker
heartbeats through this module; the GPU worker (`kernels.worker`) serves the queues and writes
its heartbeat through it. Names of queues, keys and jobs come from `kernels.protocol`.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue, SimpleWorker, Worker
from rq.job import Job
from rq.serializers import JSONSerializer

from kernels.protocol import (
    EVENTS_MAXLEN,
    JOB_FUNCTIONS,
    KINDS_SEEN_KEY,
    WORKER_TTL_S,
    WORKERS_KEY,
    ProgressEvent,
    events_key,
    queue_name,
    worker_key,
)

# Jobs and their results cross hosts through Redis, and anyone who can write there (a GPU host
# that was taken over, say) can write a job. Two rules keep a written job data, not code, for the
# process that runs or reads it (the orchestrator holds the database):
# - JSON, never RQ's default pickle, for job payloads and results;
# - a job runs only if it names one of the functions autoweb enqueues, and no callbacks.
SERIALIZER = JSONSerializer


class SafeJob(Job):
    """An RQ job that resolves only autoweb's own job functions and never a callback."""

    @property
    def func(self):
        if self.func_name not in JOB_FUNCTIONS or self.instance is not None:
            raise PermissionError(f"job {self.id}: {self.func_name!r} is not an autoweb job")
        return super().func

    def _refuse_callback(self, name: str | None) -> None:
        if name:
            raise PermissionError(f"job {self.id}: callbacks are not run ({name!r})")

    @property
    def success_callback(self):
        self._refuse_callback(self._success_callback_name)
        return None

    @property
    def failure_callback(self):
        self._refuse_callback(self._failure_callback_name)
        return None

    @property
    def stopped_callback(self):
        self._refuse_callback(getattr(self, "_stopped_callback_name", None))
        return None


class QueueWorker(SimpleWorker):
    """The RQ worker both the orchestrator and the GPU worker run: no fork per job (after CUDA
    is initialised a fork is unsafe, and the orchestrator keeps Django's connections in one
    process), JSON payloads and SafeJobs only.

    It also stops at once. RQ listens for its commands (stop a job, shut down) on a thread whose
    every wait lasts up to 60 s; when the worker ends, RQ unsubscribes, then stops that thread, and
    redis-py 8.2 made the stop wait for the thread to end. When the thread had already read the
    unsubscribe reply and gone back to waiting, that wait ran its full 60 s: a worker or the
    orchestrator took a minute to exit, now and then, after a burst or a SIGTERM. Here each wait
    lasts at most `LISTEN_S`, so the stop ends within it. A command still arrives at once: the
    wait ends when a message comes. RQ's own order is kept (unsubscribe, then stop the thread,
    then close), so the thread never closes the connection before the unsubscribe is sent.
    """

    # RQ doubles its wait after each failed try to reach Redis, up to a minute by default, so a
    # worker idle through an outage went on idling for up to a minute after Redis was back.
    max_connection_wait_time = 5.0

    def __init__(self, queues, **kwargs: Any) -> None:
        kwargs.setdefault("serializer", SERIALIZER)
        kwargs.setdefault("job_class", SafeJob)
        super().__init__(queues, **kwargs)
        self.stop_asked = False  # set by a SIGTERM or SIGINT (`request_stop`)

    def request_stop(self, signum, frame) -> None:
        # RQ's handler of SIGTERM and SIGINT: remembered, so that `serve` ends rather than
        # starting another worker when Redis is away as this one stops.
        self.stop_asked = True
        super().request_stop(signum, frame)

    def subscribe(self) -> None:
        # RQ's subscribe, with the listener's wait bounded by LISTEN_S instead of 60 s.
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=LISTEN_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )


LISTEN_S = 1.0  # the longest a worker's command listener waits before it checks for a stop
RECONNECT_S = 1.0  # how often a worker whose Redis went away asks whether it is back


def serve(
    make_worker: Callable[[int], Worker],
    conn: redis.Redis,
    *,
    burst: bool,
    name: str,
    on_reconnect: Callable[[], None] | None = None,
) -> None:
    """Run RQ workers until one ends its own way (a stop, or `burst` with the queue empty).

    Redis going away (a restart, a failover) must not end a worker process: RQ's loop raises
    ConnectionError in places it does not retry (its own bookkeeping after a job, its
    teardown), so a fresh RQ worker (`make_worker(attempt)`, a new name each time) starts once
    Redis answers again, after `on_reconnect`. A job cut short that way is found lost and run
    again by the orchestrator. The GPU worker and the orchestrator both serve this way.

    A stop (SIGTERM or SIGINT) is kept while Redis is away: a worker asked to stop whose
    teardown could not reach Redis ends `serve`, and so does a signal while it waits for Redis.
    """
    attempt = 0
    while True:
        worker = None
        try:
            worker = make_worker(attempt)
            worker.work(burst=burst, with_scheduler=False)
            return
        except redis.ConnectionError as e:
            _stop_listening(worker)
            if getattr(worker, "stop_asked", False):
                print(f"{name}: stopped (Redis unavailable: {e})", flush=True)
                return
            attempt += 1
            print(f"{name}: Redis unavailable ({e}); reconnecting", flush=True)
            if not _wait_for_redis(conn, on_reconnect):
                print(f"{name}: stopped while waiting for Redis", flush=True)
                return


def _stop_listening(worker: Worker | None) -> None:
    """End the command listener of a worker whose teardown failed: it would go on retrying,
    and listening on the channel of a worker that no longer runs, once Redis is back."""
    thread = getattr(worker, "pubsub_thread", None)
    if thread is None:
        return
    thread.stop(timeout=0)  # it ends at its next wait's end; nothing to wait for here


def _wait_for_redis(conn: redis.Redis, on_reconnect: Callable[[], None] | None) -> bool:
    """Ask Redis every RECONNECT_S until it answers (then `on_reconnect`, and True), or until
    a SIGTERM or SIGINT comes (False). RQ's handlers of those belong to the worker that ended,
    so this wait has its own; the next worker installs RQ's again."""
    stop = threading.Event()
    kept = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            kept[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(RECONNECT_S):
            try:
                conn.ping()
                if on_reconnect is not None:
                    on_reconnect()
                return True
            except redis.RedisError:
                continue
        return False
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def rq_queue(name: str, conn: redis.Redis | str) -> Queue:
    """An RQ queue of JSON-serialized SafeJobs; every queue of autoweb is made here."""
    if isinstance(conn, str):
        conn = redis.Redis.from_url(conn)
    return Queue(name, connection=conn, serializer=SERIALIZER, job_class=SafeJob)


def enqueue_gpu_job(
    conn: redis.Redis, kind: str, job: str, kwargs: dict[str, Any], *, job_id: str, timeout_s: int
) -> Job:
    """Put a job for the GPU workers of `kind` on their queue (`job`: one of the job names of
    `kernels.protocol`). Results and failures are kept a day, for the orchestrator that reads
    them and for whoever looks into a failure."""
    return rq_queue(queue_name(kind), conn).enqueue(
        job,
        kwargs=kwargs,
        job_id=job_id,
        job_timeout=timeout_s,
        result_ttl=86400,
        failure_ttl=86400,
    )


def fetch_job(job_id: str, conn: redis.Redis) -> Job:
    return SafeJob.fetch(job_id, connection=conn, serializer=SERIALIZER)


def publish(conn: redis.Redis, search_id: int | str | None, event: ProgressEvent) -> None:
    """Append one progress event to the search's stream (bounded)."""
    if search_id is None:
        return
    conn.xadd(
        events_key(search_id),
        {"data": json.dumps(event, default=str)},
        maxlen=EVENTS_MAXLEN,
        approximate=True,
    )


def register(conn: redis.Redis, name: str, info: dict[str, Any]) -> None:
    """Write a worker's heartbeat record (expires after WORKER_TTL_S)."""
    payload = {
        **info,
        "device_name": info.get("name"),  # the device's name; "name" is the worker's
        "name": name,
        "heartbeat": time.time(),
        "pid": os.getpid(),
        "host": platform.node(),
    }
    pipe = conn.pipeline()
    pipe.set(worker_key(name), json.dumps(payload, default=str), ex=WORKER_TTL_S)
    pipe.sadd(WORKERS_KEY, name)
    if info.get("kind"):  # when a worker of this kind was last heard (pages: "none since ...")
        pipe.hset(KINDS_SEEN_KEY, str(info["kind"]), payload["heartbeat"])
    pipe.execute()


def kind_last_seen(conn: redis.Redis, kind: str) -> float | None:
    """The last heartbeat (epoch seconds) of any worker of `kind`; None if never."""
    raw = conn.hget(KINDS_SEEN_KEY, kind)
    return float(raw) if raw is not None else None


def online_workers(conn: redis.Redis) -> list[dict[str, Any]]:
    """Workers whose heartbeat key has not expired (stale names are pruned)."""
    out = []
    for raw in sorted(conn.smembers(WORKERS_KEY)):
        name = raw.decode() if isinstance(raw, bytes) else raw
        data = conn.get(worker_key(name))
        if data is None:
            conn.srem(WORKERS_KEY, name)
            continue
        out.append(json.loads(data))
    return out
