"""The search loop: propose -> enqueue an evaluation on gpu.<kind> -> record -> keep/revert.

The web side of the engine (`kernels.engine`): the tuner's proposals come from its knob
proposer, verdicts from its judge (through `searches.services`). A screening win waits in
`confirming` for an interleaved re-time against the incumbent (a `confirm_job` on the same GPU
kind, one at a time per search, the fastest claim first) before it is kept; a stopping search
has its best trials and the baselines timed together (a `table_job`) for its per-shape
dispatch table.

Runs on the `search` RQ queue (a Django-aware worker; its lease, slices and queue come from
`core.control`). Everything it needs is derived from the
database and the RQ jobs, so it is resumable: kill it mid-search, restart it (`recover()` runs
at start-up), and the search continues; a trial is recorded before its job is enqueued (after
the transaction commits), its job id is derived from the trial, and results are recorded
idempotently, so no trial is lost or counted twice. An evaluation whose worker died is run
again under a new job id, up to MAX_ATTEMPTS times.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import redis
from django.db import transaction
from rq import get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry

from core import control
from core.errors import DomainError, DuplicateCandidate
from kernels.engine import compose
from kernels.engine.proposers import KnobProposer
from kernels.knobs import KnobError
from kernels.protocol import (
    CONFIRM_JOB,
    EVALUATE_JOB,
    RUN_SEARCH_JOB,
    TABLE_JOB,
    WORKER_TTL_S,
    events_key,
    queue_name,
)
from kernels.queues import enqueue_gpu_job, fetch_job, online_workers, rq_queue
from searches import live, selectors, services
from searches.models import Search, StopReason, Trial

log = logging.getLogger(__name__)

POLL_S = 0.5
MAX_ATTEMPTS = 3
JOB_TIMEOUT_S = 1800
IN_FLIGHT = Trial.IN_FLIGHT


def job_id_for(trial: Trial, attempt: int) -> str:
    return f"autoweb-trial-{trial.pk}-a{attempt}"


def confirmation_order(trial: Trial) -> tuple[bool, float, int]:
    """Which waiting screening win is re-timed first: the fastest on its screening numbers."""
    ms = trial.geomean_ms
    return (ms is None, ms if ms is not None else 0.0, trial.index)


def confirm_job_id(trial: Trial, attempt: int) -> str:
    against = (trial.confirmation or {}).get("against")
    return f"autoweb-confirm-{trial.pk}-vs{against}-a{attempt}"


def table_job_id(search: Search) -> str:
    return f"autoweb-table-{search.pk}-{uuid.uuid4().hex[:8]}"


LEASE_S = 10
# A started evaluation whose worker no live heartbeat names is run again once it is this old.
# A worker SIGKILLed mid-evaluation stops beating; its heartbeat key expires within
# WORKER_TTL_S, and the job started before the kill: so the retry is enqueued at most
# DEAD_WORKER_S after the kill, plus one orchestrator pass (docs/reliability.md, Faults).
DEAD_WORKER_S = WORKER_TTL_S + 5


def lease_key(search_id: int) -> str:
    return f"autoweb:search-lease:{search_id}"


def pending_key(search_id: int) -> str:
    return f"autoweb:search-pending:{search_id}"


# A marker outlives any wait in the queue; one naming a job that is gone is replaced at once.
PENDING_S = 3600


def enqueue_loop(conn: redis.Redis, search_id: int) -> bool:
    """Put the search's loop job in the `search` queue unless one already waits there.

    At most one pending job per search, so the queue holds at most one job per active search
    whatever enqueues it (a slice handing over, the sweep, a start, a restart). The marker
    names the waiting job; the job clears it when it starts (`run_search`). True if enqueued.
    """
    key = pending_key(search_id)
    job_id = f"autoweb-search-{search_id}-{uuid.uuid4().hex[:12]}"
    if not conn.set(key, job_id, nx=True, ex=PENDING_S):
        held = conn.get(key)
        if held is not None and _waiting(conn, held.decode()):
            return False
        conn.set(key, job_id, ex=PENDING_S)  # the job it named is gone (lost, or ran)
    control.enqueue(conn, RUN_SEARCH_JOB, search_id, job_id=job_id)
    return True


def _waiting(conn: redis.Redis, job_id: str) -> bool:
    """The job is in the `search` queue's list, waiting for an orchestrator."""
    return conn.lpos(control.search_queue(conn).key, job_id) is not None


def _started(conn: redis.Redis, search_id: int, job_id: str | None) -> None:
    """The loop job `job_id` began: its search has no job waiting any more."""
    key = pending_key(search_id)
    if job_id is not None and conn.get(key) == job_id.encode():
        conn.delete(key)


def enqueue_search(search: Search) -> None:
    """Start (or restart) the loop for a search once the current transaction commits.

    A loop runs only while it holds the search's lease, which expires LEASE_S after its holder
    dies, so a restarted loop takes over within seconds; a loop already waiting in the queue is
    not enqueued again (`enqueue_loop`).
    """
    sid = search.pk
    transaction.on_commit(lambda: enqueue_loop(control.redis_conn(), sid))


def settle_stop(search_id: int) -> None:
    """A user's stop, settled at once when no orchestrator is driving the search just now (the
    web calls it after Stop; a loop holding the lease does the same on its next pass): jobs no
    worker has taken leave their queue and, with nothing of it running, the search finishes."""
    loop = Loop(search_id)
    if not loop.lease.acquire():
        return
    try:
        if Search.objects.filter(pk=search_id, status=Search.Status.STOPPING).exists():
            loop.step()
    finally:
        loop.lease.release()


def recover() -> int:
    """Re-enqueue the loop of every active search (orchestrator start-up)."""
    n = 0
    for search in Search.objects.filter(status__in=Search.ACTIVE):
        with transaction.atomic():
            enqueue_search(search)
        n += 1
    return n


class Loop:
    """One search's loop; `step()` is one pass and returns whether to go on."""

    def __init__(self, search_id: int, conn: redis.Redis | None = None) -> None:
        self.search_id = search_id
        self.conn = conn or control.redis_conn()
        self.cursor_key = f"autoweb:events-cursor:{search_id}"
        # Only its holder drives the search; it expires LEASE_S after a killed holder's last pass.
        self.lease = control.Lease(self.conn, lease_key(search_id), LEASE_S)

    # -- the pass -----------------------------------------------------------------------------

    def step(self) -> bool:
        search = Search.objects.select_related("idea").get(pk=self.search_id)
        if search.status == Search.Status.QUEUED:
            search = services.begin_search(search=search)
            live.search_changed(search)
        if not search.is_active:
            return False
        kind = self.kind(search)
        self.forward_events()
        self.reconcile(search, kind)
        search.refresh_from_db()
        if search.status == Search.Status.RUNNING:
            reason = services.check_budget(search=search)
            if reason:
                search = services.request_stop(search=search, reason=reason)
                live.search_changed(search)
        if search.status == Search.Status.STOPPING:
            if self.kind_online(kind):  # what is in flight finishes: queued trials, re-times
                busy = search.trials.filter(status__in=IN_FLIGHT).exists()
            else:  # nothing would ever take them: what waits is withdrawn, the search ends
                self.withdraw_unstarted(search, kind)
                busy = self.running(search)
            if not busy and self.table_done(search, kind):
                search = services.finish_search(search=search, reason=search.stop_reason)
                live.search_changed(search)
                return False
            return True
        if search.status == Search.Status.RUNNING:
            self.fill(search, kind)
        return True

    def kind(self, search: Search) -> str:
        kinds = search.idea.target_kinds or ["interpret"]
        return kinds[0]

    def kind_online(self, kind: str) -> bool:
        return any(w.get("kind") == kind for w in online_workers(self.conn))

    def running(self, search: Search) -> bool:
        """Some evaluation or re-time of the search is queued or on a worker."""
        unfinished = search.trials.filter(status__in=IN_FLIGHT)
        return (
            unfinished.exclude(status=Trial.Status.PROPOSED)
            .exclude(status=Trial.Status.CONFIRMING, job_id__isnull=True)
            .exists()
        )

    def withdraw_unstarted(self, search: Search, kind: str) -> None:
        """A stopping search with no worker of its kind online: its jobs no worker has taken
        leave their GPU queue, so it stops at once instead of waiting for a worker that may
        never come. LREM is atomic with a worker's dequeue: a job is either taken by a worker
        (and finishes) or removed here (and never runs). The trials keep their place
        (`Trial.withdraw`) for a resumed search to run."""
        queue = rq_queue(queue_name(kind), self.conn)
        waiting = search.trials.filter(
            status__in=(Trial.Status.QUEUED, Trial.Status.CONFIRMING), job_id__isnull=False
        )
        for trial in waiting.order_by("index"):
            job_id = trial.job_id
            if not self.conn.lrem(queue.key, 0, job_id):
                continue
            with contextlib.suppress(NoSuchJobError):
                fetch_job(job_id, self.conn).delete(remove_from_queue=False)
            trial = services.withdraw_trial(trial=trial, job_id=job_id)
            live.trial_changed(trial)

    def capacity(self, kind: str) -> int:
        workers = [w for w in online_workers(self.conn) if w.get("kind") == kind]
        return max(1, len(workers))

    # -- results ------------------------------------------------------------------------------

    def reconcile(self, search: Search, kind: str) -> None:
        queue = rq_queue(queue_name(kind), self.conn)
        # Stopping with no worker of its kind online: nothing would take a new job.
        stranded = search.status == Search.Status.STOPPING and not self.kind_online(kind)
        StartedJobRegistry(queue=queue).cleanup()  # jobs of dead workers become "failed"
        in_flight = list(search.trials.filter(status__in=IN_FLIGHT).order_by("index"))
        waiting = [t for t in in_flight if t.status == Trial.Status.CONFIRMING and not t.job_id]
        confirming = any(t.status == Trial.Status.CONFIRMING and t.job_id for t in in_flight)
        if waiting and not confirming and not stranded:
            # One confirmation at a time per search, each against the incumbent the one before
            # it may have replaced; the fastest claim first: once it is kept, the claims that
            # do not beat it are reverted on their screening numbers, with no re-time.
            for trial in sorted(waiting, key=confirmation_order):
                if self.enqueue_confirmation(trial, kind):
                    break
        for trial in in_flight:
            if any(trial is w for w in waiting):  # judged above, or waiting its turn
                continue
            if trial.status == Trial.Status.PROPOSED or not trial.job_id:
                if not stranded:
                    self.enqueue(trial, kind, attempt=trial.attempts + 1)
                continue
            job = None
            try:
                job = fetch_job(trial.job_id, self.conn)
                status = job.get_status(refresh=True)
            except NoSuchJobError:
                status = None
            if status == JobStatus.STARTED and self.worker_died(trial, job):
                with contextlib.suppress(Exception):  # a stale registry entry; harmless if left
                    StartedJobRegistry(queue=queue).remove(job)
                status = JobStatus.STOPPED
            if status == JobStatus.FINISHED and trial.status == Trial.Status.CONFIRMING:
                self.record_confirmation(trial, job.return_value())
            elif status == JobStatus.FINISHED:
                self.record(trial, job.return_value())
            elif status in (None, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
                why = "its job disappeared" if status is None else f"its job {status}"
                if status == JobStatus.FAILED and job is not None:
                    exc = (job.latest_result().exc_string if job.latest_result() else "") or ""
                    why += ": " + exc.strip().splitlines()[-1][:300] if exc.strip() else ""
                if trial.status == Trial.Status.CONFIRMING:
                    self.confirmation_lost(trial, kind, why)
                elif trial.attempts >= MAX_ATTEMPTS:
                    trial = services.reject_trial(
                        trial=trial,
                        failure="crashed",
                        reasons=[f"evaluation lost {trial.attempts} times ({why})"],
                    )
                    live.trial_changed(trial)
                else:
                    log.warning("trial %s: %s; evaluating again", trial.pk, why)
                    self.enqueue(trial, kind, attempt=trial.attempts + 1)

    def worker_died(self, trial: Trial, job: Job) -> bool:
        """A started job no live worker's heartbeat names, once heartbeats had time to show it."""
        if any(w.get("job") == trial.job_id for w in online_workers(self.conn)):
            return False
        started = job.started_at
        if started is None:
            return False
        age = time.time() - started.timestamp()
        return age > DEAD_WORKER_S

    def record(self, trial: Trial, report: Any) -> None:
        if not isinstance(report, dict):
            trial = services.reject_trial(
                trial=trial,
                failure="malformed",
                reasons=[f"the worker returned no report ({type(report).__name__})"],
            )
        else:
            summary = report.get("summary")  # the worker's word: any type at all
            seconds = summary.get("seconds") if isinstance(summary, dict) else None
            seconds = float(seconds) if isinstance(seconds, int | float) and seconds >= 0 else 0.0
            try:
                trial = services.record_result(trial=trial, report=report, gpu_seconds=seconds)
            except DomainError as e:
                trial = services.reject_trial(
                    trial=trial,
                    failure="malformed",
                    reasons=[f"the worker's report was not usable: {e}"],
                )
        live.trial_changed(trial)
        search = trial.search
        search.refresh_from_db()
        live.search_changed(search)

    # -- confirmations and the table ------------------------------------------------------------

    def enqueue_confirmation(self, trial: Trial, kind: str) -> bool:
        """Re-time a screening win against the incumbent it beat, interleaved on one GPU.
        False when no re-time was queued: the win did not hold against the current incumbent."""
        confirmation = trial.confirmation or {}
        against = Trial.objects.filter(pk=confirmation.get("against")).first()
        incumbent = Search.objects.filter(pk=trial.search_id).values_list("incumbent_id", flat=True)
        if against is None or against.pk != incumbent.first():
            # The incumbent it beat was replaced (or is gone): a re-time against it would say
            # nothing, so it is screened again against the current one, with no GPU job.
            # Still a win, it then waits against the current incumbent and is re-timed so.
            self.record_confirmation(trial, None)
            trial.refresh_from_db()
            still = trial.status == Trial.Status.CONFIRMING
            return still and self.enqueue_confirmation(trial, kind)
        attempt = int(confirmation.get("attempts") or 0) + 1
        job_id = confirm_job_id(trial, attempt)
        kwargs = {
            "problem": trial.search.idea.problem,
            "sources": [against.source, trial.source],
            "tier": "full" if kind != "interpret" else "smoke",
            "search_id": trial.search_id,
            "trial_id": trial.pk,
        }
        with transaction.atomic():
            trial = services.mark_confirmation_queued(trial=trial, job_id=job_id)
            Trial.objects.filter(pk=trial.pk).update(
                confirmation={**confirmation, "attempts": attempt}
            )
            conn = self.conn

            def go() -> None:
                enqueue_gpu_job(
                    conn, kind, CONFIRM_JOB, kwargs, job_id=job_id, timeout_s=JOB_TIMEOUT_S
                )

            transaction.on_commit(go)
        live.trial_changed(trial)
        return True

    def record_confirmation(self, trial: Trial, result: Any) -> None:
        trial = services.record_confirmation(trial=trial, report=result)
        live.trial_changed(trial)
        search = trial.search
        search.refresh_from_db()
        live.search_changed(search)

    def confirmation_lost(self, trial: Trial, kind: str, why: str) -> None:
        attempts = int((trial.confirmation or {}).get("attempts") or 0)
        if attempts >= MAX_ATTEMPTS:
            self.record_confirmation(trial, {"error": f"re-time lost {attempts} times ({why})"})
            return
        log.warning("trial %s: confirmation %s; re-timing again", trial.pk, why)
        Trial.objects.filter(pk=trial.pk).update(job_id=None)
        trial.refresh_from_db()
        self.enqueue_confirmation(trial, kind)

    def table_done(self, search: Search, kind: str) -> bool:
        """Whether a stopping search's per-shape table is settled: recorded, not wanted (no
        timed trial, the interpreter), impossible (no worker of its kind), or failed. Starts
        its job when none runs yet."""
        if search.table is not None:
            return True
        chosen = self.table_candidates(search)
        if kind == "interpret" or not chosen:
            return True
        if search.table_job_id is None:
            if not any(w.get("kind") == kind for w in online_workers(self.conn)):
                services.record_table(
                    search=search,
                    timed={"error": f"no {kind} worker online to time the table"},
                    kernels=[],
                )
                return True
            self.enqueue_table(search, kind, chosen)
            return False
        try:
            job = fetch_job(search.table_job_id, self.conn)
            status = job.get_status(refresh=True)
        except NoSuchJobError:
            job, status = None, None
        if status == JobStatus.FINISHED:
            services.record_table(
                search=search, timed=job.return_value(), kernels=[t.index for t in chosen]
            )
            live.search_changed(Search.objects.get(pk=search.pk))
            return True
        if status in (None, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
            services.record_table(
                search=search,
                timed={"error": f"timing the table's trials failed (job {status or 'lost'})"},
                kernels=[],
            )
            return True
        if (
            status == JobStatus.QUEUED
            and not self.kind_online(kind)
            and self.conn.lrem(rq_queue(queue_name(kind), self.conn).key, 0, job.id)
        ):  # every worker of its kind left before taking it: the search stops without a table
            job.delete(remove_from_queue=False)
            services.record_table(
                search=search,
                timed={"error": f"no {kind} worker online to time the table"},
                kernels=[],
            )
            return True
        return False

    def table_candidates(self, search: Search) -> list[Trial]:
        """The timed, accepted trials to time together for the table (`compose.pick_candidates`)."""
        trials = list(
            search.trials.filter(
                status__in=(Trial.Status.KEPT, Trial.Status.REVERTED), geomean_ms__isnull=False
            ).order_by("index")
        )
        chosen = compose.pick_candidates([t.report or {} for t in trials])
        return [trials[i] for i in chosen]

    def enqueue_table(self, search: Search, kind: str, chosen: list[Trial]) -> None:
        job_id = table_job_id(search)
        kwargs = {
            "problem": search.idea.problem,
            "sources": [t.source for t in chosen],
            "tier": "full",
            "search_id": search.pk,
        }
        with transaction.atomic():
            services.mark_table_queued(search=search, job_id=job_id)
            conn = self.conn

            def go() -> None:
                enqueue_gpu_job(
                    conn, kind, TABLE_JOB, kwargs, job_id=job_id, timeout_s=JOB_TIMEOUT_S
                )

            transaction.on_commit(go)

    # -- proposals ----------------------------------------------------------------------------

    def fill(self, search: Search, kind: str) -> None:
        in_flight = search.trials.filter(status__in=IN_FLIGHT).count()
        if search.idea.model_name:  # an LLM search: the agent's step (with hybrid tuning)
            from searches.agent import step as agent

            agent.fill(
                search,
                kind,
                capacity=self.capacity(kind),
                enqueue=lambda trial: self.enqueue(trial, kind, attempt=1),
                renew=self.lease.renew,
            )
            return
        room = self.capacity(kind) - in_flight
        if room <= 0:
            return
        try:
            proposer = KnobProposer(
                search.idea.start_source(), budget=search.idea.max_trials, seed=search.seed
            )
        except KnobError as e:
            search = services.fail_search(search=search, reason=f"{StopReason.ERROR}: {e}")
            live.search_changed(search)
            return
        if search.strategy != f"{proposer.strategy}: {proposer.why}":
            search = services.set_strategy(
                search=search, strategy=f"{proposer.strategy}: {proposer.why}"
            )
            live.search_changed(search)
        while room > 0:
            proposal = proposer.next(selectors.tried_of(search))
            if proposal is None:
                if in_flight == 0:
                    search = services.request_stop(
                        search=search, reason="tuner: every knob configuration was tried"
                    )
                    live.search_changed(search)
                return
            with transaction.atomic():
                try:
                    trial = services.record_proposal(
                        search=search,
                        source=proposal.source,
                        parent=search.incumbent,
                        proposer="tuner",
                        rationale=proposal.rationale,
                        knob_values=proposal.knob_values,
                    )
                except DuplicateCandidate as e:
                    search = services.skip_variant(
                        search=search, values=proposal.knob_values, reason=_message(e)
                    )
                    live.search_changed(search)
                    continue
                except DomainError as e:
                    log.info("search %s: no proposal recorded: %s", search.pk, e)
                    return
                trial = services.screen_trial(trial=trial)
                if not trial.terminal:
                    self.enqueue(trial, kind, attempt=1)
            live.trial_changed(trial)
            in_flight += 1
            room -= 1
            search.refresh_from_db()

    def enqueue(self, trial: Trial, kind: str, attempt: int) -> None:
        job_id = job_id_for(trial, attempt)
        idea = trial.search.idea
        with transaction.atomic():
            trial = services.mark_trial_queued(trial=trial, job_id=job_id)
            kwargs = {
                "problem": idea.problem,
                "source": trial.source,
                "search_id": trial.search_id,
                "trial_id": trial.pk,
                "tier": "full" if kind != "interpret" else "smoke",
            }
            conn = self.conn

            def go() -> None:
                enqueue_gpu_job(
                    conn, kind, EVALUATE_JOB, kwargs, job_id=job_id, timeout_s=JOB_TIMEOUT_S
                )

            transaction.on_commit(go)
        live.trial_changed(trial)

    # -- progress -----------------------------------------------------------------------------

    def forward_events(self) -> None:
        """Apply workers' progress events to trials and pass them to browsers, once per poll.

        The events since the last poll are coalesced (`coalesce`): of a trial's run of events in
        one phase only the newest counts, every change of phase is kept. They are applied in one
        transaction and reach the search's group as one message, rendered once for every viewer.
        """
        last = self.conn.get(self.cursor_key)
        last = last.decode() if last else "0-0"
        entries = self.conn.xrange(events_key(self.search_id), min=f"({last}", count=500)
        events = []
        for entry_id, fields in entries:
            last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            try:
                event = json.loads(fields[b"data"])
                trial_id = int(event.get("trial"))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            if event.get("phase") in Trial.PHASES:
                events.append({**event, "trial": trial_id})
        if events:
            self.apply_events(coalesce(events))
        self.conn.set(self.cursor_key, last, ex=7 * 86400)

    def apply_events(self, events: list[dict[str, Any]]) -> None:
        changes: list[tuple[Trial, dict[str, Any]]] = []
        with transaction.atomic():
            ids = {e["trial"] for e in events}
            trials = {
                t.pk: t
                for t in Trial.objects.filter(pk__in=ids, search_id=self.search_id).only(
                    "id", "status"
                )
            }
            for event in events:
                trial = trials.get(event["trial"])
                if trial is None or trial.terminal:
                    continue
                before = trial.status
                trial = services.mark_trial_phase(trial=trial, phase=event["phase"])
                trials[trial.pk] = trial
                # A late event for a phase the trial has left shows nothing new: not pushed.
                if trial.status != before or live.progress(trial, event) is not None:
                    changes.append((trial, event))
            live.trials_changed(self.search_id, changes)  # sent once this commits


def _message(error: Exception) -> str:
    messages = getattr(error, "messages", None)
    return "; ".join(str(m) for m in messages) if messages else str(error)


def coalesce(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events a browser must see, in order: per trial, a run of progress events in one
    phase becomes its newest one (only the latest `shape i/n` matters), and every change of
    phase starts a new run, so no status transition is merged away. An event without a progress
    phase (anything else a stream may carry) is never merged and ends its trial's run."""
    kept: list[dict[str, Any]] = []
    run: dict[Any, int] = {}  # trial -> position in `kept` of its current run
    for event in events:
        trial, phase = event.get("trial"), event.get("phase")
        at = run.get(trial)
        if phase not in Trial.PHASES:
            run.pop(trial, None)
            kept.append(event)
        elif at is not None and kept[at].get("phase") == phase:
            kept[at] = event
        else:
            run[trial] = len(kept)
            kept.append(event)
    return kept


SLICE_S = 5.0
MAX_STEP_ERRORS = 10
SWEEP_S = 5


def sweep(conn: redis.Redis) -> int:
    """Re-enqueue active searches whose loop died (no lease, no loop job waiting). At most every
    SWEEP_S seconds across all orchestrators."""
    if not conn.set("autoweb:sweep", "1", nx=True, ex=SWEEP_S):
        return 0
    n = 0
    for sid in Search.objects.filter(status__in=Search.ACTIVE).values_list("pk", flat=True):
        if not conn.exists(lease_key(sid)) and enqueue_loop(conn, sid):
            n += 1
    mirror_workers(conn)
    return n


def mirror_workers(conn: redis.Redis) -> int:
    """Copy the live workers' heartbeats (Redis: the liveness that counts) into the Worker
    table: what each one measured (ceilings), its versions, its job in flight and its last
    beat, for the pages, the roofline floors and the agent's prompt. Returns how many."""
    n = 0
    for w in online_workers(conn):
        kind = str(w.get("kind") or "")
        try:
            beat = datetime.fromtimestamp(float(w.get("heartbeat") or time.time()), tz=UTC)
            services.upsert_worker(
                name=str(w.get("name") or ""),
                kind=kind,
                device_name=str(w.get("device_name") or ""),
                ceilings=w.get("ceilings") or None,
                versions=w.get("versions") or {},
                queue=str(w.get("queue") or f"gpu.{kind}"),
                now=beat,
            )
            services.heartbeat(name=str(w["name"]), current_job_id=w.get("job"), now=beat)
        except (DomainError, KeyError, TypeError, ValueError) as e:
            log.warning("worker %r: heartbeat not mirrored: %s", w.get("name"), e)
            continue
        n += 1
    return n


def run_search(search_id: int, *, poll_s: float = POLL_S, slice_s: float | None = SLICE_S) -> str:
    """Drive one search for a time slice, then hand it back to the queue.

    Slices let a few orchestrator processes serve many searches round-robin; the lease makes
    sure only one loop drives a search at a time. A slice ends after `slice_s`, or after one
    pass when other jobs wait in the `search` queue: each search then gets a pass in turn, in
    the order they handed over (one job per search waits there at most: `enqueue_loop`).
    """
    loop = Loop(search_id)
    job = get_current_job()
    held = loop.lease.acquire()
    with contextlib.suppress(redis.RedisError):
        _started(loop.conn, search_id, job.id if job is not None else None)
    if not held:
        return "another loop holds this search"
    control.pace(loop.conn, f"search-{search_id}", poll_s)
    started = time.monotonic()
    active = True
    errors = 0
    try:
        while True:
            try:
                if not loop.lease.renew():
                    return "lost the lease to another loop"
                active = loop.step()
                errors = 0
                control.passed(loop.conn, f"search-{search_id}", poll_s)
            except redis.RedisError as e:  # Redis restarting: the database keeps every trial
                log.warning("search %s: Redis unavailable (%s); retrying", search_id, e)
                time.sleep(1.0)
                continue
            except Exception as e:
                errors += 1
                log.exception("search %s: loop step failed (%d in a row)", search_id, errors)
                if errors >= MAX_STEP_ERRORS:
                    search = services.fail_search(
                        search=Search.objects.get(pk=search_id),
                        reason=f"the orchestrator failed {errors} times in a row: "
                        f"{type(e).__name__}: {e}"[:400],
                    )
                    live.search_changed(search)
                    return search.status
                time.sleep(1.0)
                continue
            if not active:
                break
            elapsed = time.monotonic() - started
            if slice_s is not None and control.slice_over(loop.conn, elapsed, slice_s):
                break
            time.sleep(poll_s)
    finally:
        with contextlib.suppress(redis.RedisError):
            loop.lease.release()
    if active:
        with contextlib.suppress(redis.RedisError):
            enqueue_loop(loop.conn, search_id)
            sweep(loop.conn)
    return Search.objects.values_list("status", flat=True).get(pk=search_id)
