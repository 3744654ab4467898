"""The GPU workers as the pages show them: the ones heartbeating in Redis (online) merged with
the ones registered in the database, and the depth of each `gpu.<kind>` queue.

Redis being down is a state the pages show ("Redis unreachable"), not an error page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone

from kernels.protocol import queue_name
from kernels.queues import kind_last_seen, online_workers, rq_queue
from searches.models import Search, Trial, Worker

# A page waits at most this long for Redis before saying it is unreachable.
REDIS_TIMEOUT_S = 1.0


@dataclass
class WorkerRow:
    name: str
    kind: str
    device: str = ""
    host: str = ""
    online: bool = False
    queue: str = ""
    ceilings: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    job: str = ""
    heartbeat_age_s: float | None = None
    registered: bool = False  # has a row in the database
    queue_depth: int | None = None  # jobs waiting on gpu.<kind>; None when Redis is down


@dataclass
class Fleet:
    workers: list[WorkerRow] = field(default_factory=list)
    queues: dict[str, int | None] = field(default_factory=dict)  # kind -> jobs waiting
    redis_error: str = ""

    @property
    def online(self) -> list[WorkerRow]:
        return [w for w in self.workers if w.online]

    @property
    def kinds(self) -> list[str]:
        return sorted({w.kind for w in self.online if w.kind})


def connect() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=REDIS_TIMEOUT_S,
        socket_timeout=REDIS_TIMEOUT_S,
    )


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _from_redis(payload: dict[str, Any], now: float) -> WorkerRow:
    ceilings = _dict(payload.get("ceilings"))
    heartbeat = payload.get("heartbeat")
    return WorkerRow(
        name=str(payload.get("name") or "?"),
        kind=str(payload.get("kind") or ""),
        # The worker's payload names the worker in "name"; the device may be under its own key
        # or, on CUDA, in the measured ceilings.
        device=str(
            payload.get("device_name") or payload.get("device") or ceilings.get("device") or ""
        ),
        host=str(payload.get("host") or ""),
        online=True,
        queue=str(payload.get("queue") or ""),
        ceilings=ceilings,
        versions=_dict(payload.get("versions")),
        job=str(payload.get("job") or ""),
        heartbeat_age_s=(now - heartbeat) if isinstance(heartbeat, int | float) else None,
    )


def _from_db(worker: Worker, now: Any) -> WorkerRow:
    return WorkerRow(
        name=worker.name,
        kind=worker.kind,
        device=worker.device_name,
        online=worker.is_online(now),
        queue=worker.queue,
        ceilings=_dict(worker.ceilings),
        versions=_dict(worker.versions),
        job=worker.current_job_id or "",
        heartbeat_age_s=(
            (now - worker.last_heartbeat).total_seconds() if worker.last_heartbeat else None
        ),
        registered=True,
    )


def fleet(*, registered: bool = True) -> Fleet:
    """Online workers from Redis, plus (with `registered`) every worker row in the database."""
    out = Fleet()
    rows: dict[str, WorkerRow] = {}
    if registered:
        now = timezone.now()
        for worker in Worker.objects.order_by("kind", "name"):
            rows[worker.name] = _from_db(worker, now)
    conn = connect()
    try:
        for payload in online_workers(conn):
            row = _from_redis(_dict(payload), time.time())
            known = rows.get(row.name)
            if known is not None:
                row.registered = True
                row.device = row.device or known.device
                row.ceilings = row.ceilings or known.ceilings
                row.job = row.job or known.job
            rows[row.name] = row
        for kind in sorted({r.kind for r in rows.values() if r.kind}):
            out.queues[kind] = rq_queue(queue_name(kind), conn).count
    except (redis.RedisError, OSError) as exc:
        out.redis_error = (
            f"Redis at {_where(settings.REDIS_URL)} is unreachable ({type(exc).__name__}): "
            "online workers and queue depths cannot be shown. Start Redis or set REDIS_URL."
        )
        out.queues = {kind: None for kind in sorted({r.kind for r in rows.values() if r.kind})}
    finally:
        conn.close()
    for row in rows.values():
        row.queue_depth = out.queues.get(row.kind)
    out.workers = sorted(rows.values(), key=lambda r: (not r.online, r.kind, r.name))
    return out


def measured_ceilings(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """GPU kind -> the ceilings its workers measured (copy bandwidth, bf16 matrix rate), from an
    online worker when one is up, else from a registered one, with the worker and device they
    came from. A kind none of whose workers reported both numbers is left out: the pages say
    so rather than use a datasheet figure."""
    out: dict[str, dict[str, Any]] = {}
    for row in sorted(fleet.workers, key=lambda r: (not r.online, r.name)):
        c = row.ceilings
        numbers = [c.get("copy_gbps"), c.get("matmul_tflops_bf16")]
        valid = all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1e9 for v in numbers
        )
        if row.kind and row.kind not in out and valid:
            out[row.kind] = {
                "copy_gbps": float(numbers[0]),
                "matmul_tflops_bf16": float(numbers[1]),
                "worker": row.name,
                "device": row.device or str(c.get("device") or ""),
                "online": row.online,
            }
    return out


def _where(url: str) -> str:
    """host:port/db of a Redis URL, without any password it may carry."""
    rest = url.split("://", 1)[-1]
    return rest.rsplit("@", 1)[-1]


def waiting_for(kind: str) -> str | None:
    """Why work for `kind` is not running, when no worker of that kind is online: "waiting for
    an h200 worker (none online since ...)"; None when one is online."""
    conn = connect()
    try:
        if any(w.get("kind") == kind for w in online_workers(conn)):
            return None
        seen = kind_last_seen(conn, kind)
    except (redis.RedisError, OSError):
        return f"waiting for a {kind} worker (Redis is unreachable: which are online is unknown)"
    finally:
        conn.close()
    article = "an" if kind[:1].lower() in "aeiou" or kind.lower().startswith("h") else "a"
    if seen is None:
        return f"waiting for {article} {kind} worker (none has been online)"
    when = timezone.localtime(datetime.fromtimestamp(seen, tz=UTC))
    return f"waiting for {article} {kind} worker (none online since {when:%Y-%m-%d %H:%M %Z})"


def search_kind(search: Search) -> str:
    """The GPU kind a search's trials run on (the orchestrator's `Loop.kind`)."""
    return (search.idea.target_kinds or ["interpret"])[0]


def trial_waiting(trial: Trial) -> str | None:
    """Why an active search's trial not yet taken by a worker has not started, when no worker
    of its kind is online; None otherwise."""
    if trial.status not in (Trial.Status.PROPOSED, Trial.Status.QUEUED):
        return None
    if not trial.search.is_active:
        return None
    return waiting_for(search_kind(trial.search))


def search_waiting(search: Search) -> str | None:
    """`trial 3 is waiting for an h200 worker (none online since ...)` for an active search
    whose oldest trial not yet taken by a worker cannot be, for want of a worker online."""
    if not search.is_active:
        return None
    trial = (
        search.trials.filter(status__in=(Trial.Status.PROPOSED, Trial.Status.QUEUED))
        .only("index")
        .order_by("index")
        .first()
    )
    if trial is None:
        return None
    why = waiting_for(search_kind(search))
    return f"trial {trial.index} is {why}" if why else None
