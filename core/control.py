"""The control plane: the `search` queue that the orchestrators serve, and what its jobs share.

A job on `search` drives one thing for a time slice (a search's loop:
`searches.orchestrator.run_search`; an approval's re-validation watcher: `library.watch.watch`),
then puts itself back on the queue, so a few orchestrator processes (`manage.py orchestrator`)
serve every search and every review in turn. Each such job uses

- a `Lease`, so that one job at a time drives a thing: a Redis key that holds its holder's token,
  expires when the holder stops renewing it (a killed process), and is renewed or released only
  by its holder;
- `slice_over`: a slice ends when its time is up, or after one pass while another job waits;
- `pace` and `passed`: a thing's passes are at least a poll interval apart, whichever job
  makes them, so that a few things handing over to each other after one pass each are not
  stepped back to back;
- `enqueue`: a JSON job on the queue (`kernels.queues`), with what every control job shares
  (no timeout: it ends its own slice);
- recovery: each app registers in its `AppConfig.ready()` what it resumes when an orchestrator
  starts (`on_orchestrator_start`); the orchestrator runs them all at start-up (`recover`).

It imports neither web app (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from rq import Queue
from rq.job import Job

from kernels.protocol import SEARCH_QUEUE
from kernels.queues import rq_queue

RESULT_TTL_S = 600  # a finished control job's return value ("continuing", a search's status)
FAILURE_TTL_S = 86400  # a failed one's traceback, for whoever investigates


def redis_conn() -> redis.Redis:
    """A connection to the project's Redis (`settings.REDIS_URL`)."""
    return redis.Redis.from_url(settings.REDIS_URL)


def search_queue(conn: redis.Redis | None = None) -> Queue:
    return rq_queue(SEARCH_QUEUE, conn or redis_conn())


def enqueue(conn: redis.Redis, job: str, *args: Any, job_id: str | None = None) -> Job:
    """Put `job` (one of autoweb's job names, `kernels.protocol`) with JSON `args` on the
    `search` queue."""
    return search_queue(conn).enqueue(
        job,
        *args,
        job_id=job_id,
        job_timeout=-1,
        result_ttl=RESULT_TTL_S,
        failure_ttl=FAILURE_TTL_S,
    )


def slice_over(conn: redis.Redis, elapsed: float, slice_s: float) -> bool:
    """The slice is over: its time is up, or another job waits for an orchestrator (then each
    job gets a pass in turn, in the order they handed over)."""
    if elapsed > slice_s:
        return True
    try:
        return search_queue(conn).count > 0
    except redis.RedisError:
        return False


def pass_key(what: str) -> str:
    return f"autoweb:pass:{what}"


def pace(conn: redis.Redis, what: str, poll_s: float) -> None:
    """Wait until `poll_s` has passed since the last pass over `what` (`passed`), whichever job
    made it. A slice hands over after one pass while other jobs wait: with two things and one
    orchestrator each would otherwise come straight back, and the two would be stepped back to
    back, dozens of passes a second of database and Redis round trips (a core of the GPU host)
    for work that takes seconds. With many things a round takes longer than `poll_s` and no
    pass waits."""
    try:
        raw = conn.get(pass_key(what))
        wait = float(raw) + poll_s - time.time() if raw is not None else 0.0
    except (redis.RedisError, ValueError):
        return
    if wait > 0:
        time.sleep(min(wait, poll_s))


def passed(conn: redis.Redis, what: str, poll_s: float) -> None:
    """A pass over `what` has just been made (`pace`)."""
    with contextlib.suppress(redis.RedisError):
        conn.set(pass_key(what), repr(time.time()), ex=max(60, math.ceil(4 * poll_s)))


class Lease:
    """Who drives a thing just now: `key` holds the holder's token for `ttl_s` seconds."""

    def __init__(self, conn: redis.Redis, key: str, ttl_s: float) -> None:
        self.conn = conn
        self.key = key
        self.ttl_s = max(1, math.ceil(ttl_s))  # Redis expiries are whole seconds
        self.token = uuid.uuid4().hex

    def acquire(self, wait_s: float = 0.0, poll_s: float = 0.5) -> bool:
        """Take the lease, waiting up to `wait_s` for a dead holder's to expire; False if a live
        holder keeps it."""
        deadline = time.monotonic() + wait_s
        while True:
            if self.conn.set(self.key, self.token, nx=True, ex=self.ttl_s):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)

    def renew(self) -> bool:
        """Extend the lease by `ttl_s`; False if it is not ours any more (it expired)."""
        if self.conn.get(self.key) != self.token.encode():
            return False
        self.conn.expire(self.key, self.ttl_s)
        return True

    def release(self) -> None:
        """Give the lease up, if it is still ours."""
        if self.conn.get(self.key) == self.token.encode():
            self.conn.delete(self.key)


_recoveries: dict[str, Callable[[], int]] = {}


def on_orchestrator_start(what: str, fn: Callable[[], int]) -> None:
    """Run `fn` when an orchestrator starts: it puts back on the queue the jobs of `what` (e.g.
    "active search(es)") that were in flight, and returns how many."""
    _recoveries[what] = fn


def recover() -> dict[str, int]:
    """Every registered recovery, in the order the apps registered them: what -> how many."""
    return {what: fn() for what, fn in _recoveries.items()}
