"""Waits for an approval's re-validation jobs on the `search` queue (a Django-aware worker) and
records their results, like the orchestrator does for trials: in time slices, re-enqueuing
itself, so a few orchestrator processes serve every review. Idempotent: recording twice is no
change, and a lost job runs again (services.poll)."""

from __future__ import annotations

import logging
import time
import uuid

import redis

from kernels.protocol import WATCH_REVIEW_JOB
from kernels.queues import rq_queue
from library import services
from library.models import Revalidation, Review

log = logging.getLogger(__name__)

POLL_S = 1.0
SLICE_S = 5.0


def lease_key(review_id: int) -> str:
    return f"autoweb:review-watch:{review_id}"


def recover() -> int:
    """Start a watcher for every approval still re-validating (orchestrator start-up)."""
    ids = list(
        Review.objects.filter(revalidations__status=Revalidation.Status.QUEUED)
        .values_list("pk", flat=True)
        .distinct()
    )
    for rid in ids:
        services._enqueue_watch(rid)
    return len(ids)


def watch(review_id: int, *, poll_s: float = POLL_S, slice_s: float = SLICE_S) -> str:
    started = time.monotonic()
    conn = services.redis_conn()
    # One watcher per review at a time: a duplicate (recover() after a restart) steps aside.
    token = uuid.uuid4().hex
    if not conn.set(lease_key(review_id), token, nx=True, ex=int(slice_s + 30)):
        return "another watcher holds this review"
    try:
        return _loop(review_id, conn, started, poll_s, slice_s, token)
    finally:
        _release(conn, review_id, token)


def _release(conn: redis.Redis, review_id: int, token: str) -> None:
    if conn.get(lease_key(review_id)) == token.encode():
        conn.delete(lease_key(review_id))


def _loop(review_id, conn, started, poll_s, slice_s, token) -> str:
    while True:
        review = Review.objects.select_related("trial__search__idea").get(pk=review_id)
        try:
            if services.poll(review=review, conn=conn):
                return review.outcome
        except redis.RedisError as e:
            log.warning("review %s: Redis unavailable (%s); retrying", review_id, e)
        if time.monotonic() - started > slice_s:
            _release(conn, review_id, token)  # before the next slice could look for it
            rq_queue(services.WATCH_QUEUE, conn).enqueue(
                WATCH_REVIEW_JOB,
                review_id,
                job_timeout=-1,
                result_ttl=600,
                failure_ttl=86400,
            )
            return "continuing"
        time.sleep(poll_s)
