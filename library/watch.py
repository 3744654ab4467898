"""Waits for an approval's re-validation jobs on the `search` queue (a Django-aware worker) and
records their results, like the orchestrator does for trials: in time slices under a lease,
re-enqueuing itself (`core.control`), so a few orchestrator processes serve every review and
every search in turn. Idempotent: recording twice is no change, and a lost job runs again
(services.poll)."""

from __future__ import annotations

import logging
import time

import redis

from core import control
from kernels.protocol import WATCH_REVIEW_JOB
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
        services.enqueue_watch(rid)
    return len(ids)


def watch(review_id: int, *, poll_s: float = POLL_S, slice_s: float = SLICE_S) -> str:
    started = time.monotonic()
    conn = control.redis_conn()
    # One watcher per review at a time: a duplicate (recover() after a restart) steps aside. The
    # lease outlives the slice, so it is never renewed; a killed watcher's expires on its own.
    lease = control.Lease(conn, lease_key(review_id), slice_s + 30)
    if not lease.acquire():
        return "another watcher holds this review"
    control.pace(conn, f"review-{review_id}", poll_s)
    try:
        while True:
            review = Review.objects.select_related("trial__search__idea").get(pk=review_id)
            try:
                if services.poll(review=review, conn=conn):
                    return review.outcome
            except redis.RedisError as e:
                log.warning("review %s: Redis unavailable (%s); retrying", review_id, e)
            control.passed(conn, f"review-{review_id}", poll_s)
            if control.slice_over(conn, time.monotonic() - started, slice_s):
                lease.release()  # before the next slice could look for it
                control.enqueue(conn, WATCH_REVIEW_JOB, review_id)
                return "continuing"
            time.sleep(poll_s)
    finally:
        lease.release()
