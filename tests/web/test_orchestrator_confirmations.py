"""Which screening win the orchestrator re-times, and when none is needed. Real Redis and RQ
queues; the orchestrator's reconcile runs in-process, the re-times' results are recorded as the
orchestrator records a finished `confirm_job`.

A search from a weak start has many screening wins waiting at once. Re-timing them oldest
first, each against the incumbent it beat, spent a full interleaved re-time on every one of
them, also on claims against an incumbent that had since been replaced (an H200 stack run
chained 13 such re-times of ~11 s each behind one another)."""

from __future__ import annotations

import pytest

from kernels.worker import queue_name, rq_queue
from searches import orchestrator, services
from searches.models import Search, Trial
from tests.web.domain import accepted, judge, propose

pytestmark = pytest.mark.django_db(transaction=True)

T = Trial.Status


def _confirm_jobs(conn) -> list[str]:
    key = rq_queue(queue_name("h200"), conn).key
    return [i.decode() for i in conn.lrange(key, 0, -1) if b"confirm" in i]


def _reconcile(search: Search, conn) -> None:
    loop = orchestrator.Loop(search.pk, conn)
    loop.reconcile(Search.objects.get(pk=search.pk), "h200")


def _retime_done(conn, trial: Trial, incumbent_ms: float, challenger_ms: float) -> Trial:
    """A worker took the queued re-time and it finished: recorded as `reconcile` records it."""
    conn.delete(rq_queue(queue_name("h200"), conn).key)
    trial.refresh_from_db()
    pair = [{"geomean_ms": ms, "noise": 0.01} for ms in (incumbent_ms, challenger_ms)]
    services.record_confirmation(trial=trial, report=pair)
    trial.refresh_from_db()
    return trial


@pytest.fixture
def claims(search, redis_url):
    """Trial 1 kept at 0.50 ms; trials 2-4 screened faster beyond noise, waiting for a re-time."""
    conn = redis_url  # the fixture's connection to its own flushed database
    first = judge(propose(search, 1), accepted(ms=0.50))
    waiting = [
        judge(propose(search, i), accepted(ms=ms), confirm=False)
        for i, ms in ((2, 0.45), (3, 0.30), (4, 0.40))
    ]
    assert [t.status for t in waiting] == [T.CONFIRMING] * 3
    return conn, first, waiting


def test_the_fastest_waiting_claim_is_re_timed_first_and_only_one_at_a_time(search, claims):
    conn, first, (t2, t3, t4) = claims

    _reconcile(search, conn)
    _reconcile(search, conn)  # a second pass queues nothing more while one re-time is out

    assert _confirm_jobs(conn) == [f"autoweb-confirm-{t3.pk}-vs{first.pk}-a1"]
    t3.refresh_from_db()
    assert t3.status == T.CONFIRMING and t3.job_id


def test_claims_the_kept_one_beats_are_reverted_without_a_re_time(search, claims):
    conn, first, (t2, t3, t4) = claims
    _reconcile(search, conn)
    assert _retime_done(conn, t3, 0.50, 0.30).status == T.KEPT

    _reconcile(search, conn)

    assert _confirm_jobs(conn) == []
    for trial, ms in ((t2, "0.45"), (t4, "0.4")):
        trial.refresh_from_db()
        assert trial.status == T.REVERTED
        assert trial.reason == f"{ms} ms vs incumbent 0.3 ms (noise 2.0%): not faster beyond noise"
    assert Search.objects.get(pk=search.pk).incumbent_id == t3.pk


def test_a_claim_that_still_wins_against_the_new_incumbent_is_re_timed_against_it(search, claims):
    conn, first, (t2, t3, t4) = claims
    _reconcile(search, conn)
    # Trial 3's re-time refutes it; trial 4 (0.40 ms) is next, kept at 0.40 ms.
    assert _retime_done(conn, t3, 0.50, 0.49).status == T.REVERTED
    _reconcile(search, conn)
    assert _confirm_jobs(conn) == [f"autoweb-confirm-{t4.pk}-vs{first.pk}-a1"]
    t4 = _retime_done(conn, t4, 0.50, 0.40)
    assert t4.status == T.KEPT
    # A faster claim waits against trial 1, which trial 4 replaced: screened again against
    # trial 4 it still wins, so it is re-timed against trial 4, not trial 1.
    t5 = judge(propose(search, 5), accepted(ms=0.20), confirm=False)
    assert t5.confirmation["against"] == t4.pk
    Trial.objects.filter(pk=t5.pk).update(confirmation={**t5.confirmation, "against": first.pk})

    _reconcile(search, conn)

    t5.refresh_from_db()
    assert t5.status == T.CONFIRMING and t5.confirmation["against"] == t4.pk
    assert _confirm_jobs(conn) == [f"autoweb-confirm-{t5.pk}-vs{t4.pk}-a1"]
