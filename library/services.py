"""Writes: reviewer decisions, re-validation results, releases and their revocation.

Every function takes keyword arguments, runs in one transaction, and raises
`core.errors.DomainError` (field -> messages) for bad input or `PermissionDenied` for a
missing role. Decisions are idempotent: the same `request_key` returns the review it made, and
a trial holds at most one review (row lock + OneToOne), so a double submit has one effect.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import redis
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone
from rq.exceptions import NoSuchJobError
from rq.job import JobStatus
from rq.registry import StartedJobRegistry

from core import control, roles
from core.errors import DomainError
from core.storable import storable_json
from kernels import problems as registry
from kernels.engine import compose
from kernels.protocol import (
    REVALIDATE_JOB,
    WATCH_REVIEW_JOB,
    queue_name,
    source_sha256,
)
from kernels.queues import enqueue_gpu_job, fetch_job, rq_queue
from library import selectors
from library.models import Release, Revalidation, Review
from searches.agent.notes import add_note
from searches.models import Idea, Trial

log = logging.getLogger(__name__)

MAX_TEXT = 10_000
MAX_REQUEST_KEY = 100
MAX_ATTEMPTS = 3
JOB_TIMEOUT_S = 3600
PAST = {
    "approve": "approved",
    "veto": "vetoed",
    "send_back": "sent back",
}


def _require_reviewer(user: Any, action: str) -> None:
    if not roles.is_reviewer(user):
        raise PermissionDenied(f"Only reviewers may {action}.")


# -- decisions --------------------------------------------------------------------------------


def problem_dims(problem: str) -> list[str]:
    """The dims of a problem's shapes, in sweep order (e.g. ["M", "N"])."""
    loaded = registry.load(problem)
    return list(loaded.shapes("full")[0])


def measured_range(trial: Trial) -> dict[str, list[int]]:
    """Min and max of each dim over the shapes the trial was measured on: the default range."""
    out: dict[str, list[int]] = {}
    for row in (trial.report or {}).get("shapes") or []:
        shape = row.get("shape") if isinstance(row, dict) else None
        if not isinstance(shape, dict):
            continue
        for dim, value in shape.items():
            if isinstance(value, int):
                lo, hi = out.get(dim, [value, value])
                out[dim] = [min(lo, value), max(hi, value)]
    return out


def _clean_range(problem: str, shape_range: Any, bad: Any) -> dict[str, list[int]]:
    dims = problem_dims(problem)
    if not isinstance(shape_range, Mapping) or not shape_range:
        bad("shape_range", f"Choose the shape range to release on, per dim ({', '.join(dims)}).")
        return {}
    cleaned: dict[str, list[int]] = {}
    for dim, bounds in shape_range.items():
        if dim not in dims:
            bad("shape_range", f"{dim!r} is not a dim of {problem} (dims: {', '.join(dims)}).")
            continue
        try:
            lo, hi = (int(b) for b in bounds)
        except (TypeError, ValueError):
            bad("shape_range", f"{dim}: give two whole numbers, from and to.")
            continue
        if not 1 <= lo <= hi < 2**40:
            bad("shape_range", f"{dim}: need 1 <= from <= to; got {lo} to {hi}.")
            continue
        cleaned[dim] = [lo, hi]
    return cleaned


def _text(value: Any, field: str, bad: Any, *, required: str | None) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if "\x00" in text:
        bad(field, "The text contains a NUL byte.")
    elif len(text) > MAX_TEXT:
        bad(field, f"The text is {len(text):,} characters; keep it within {MAX_TEXT:,}.")
    elif required and not text:
        bad(field, required)
    return text


@transaction.atomic
def decide(
    *,
    trial: Trial,
    user: Any,
    action: str,
    text: str = "",
    prohibit: bool = False,
    shape_range: Mapping[str, Any] | None = None,
    request_key: str | None = None,
) -> Review:
    """Approve, veto or send back a candidate in the review queue.

    Approve needs a shape range and starts re-validation on every target GPU kind (after
    commit). Veto needs a reason, send back a note; with `prohibit` the text is appended to the
    idea's prohibitions. Either way the text reaches the agent (selectors.review_notes_for_search).
    """
    _require_reviewer(user, "approve, veto or send back candidates")
    if request_key is not None:
        request_key = str(request_key).strip()[:MAX_REQUEST_KEY] or None
    if request_key:
        same = Review.objects.filter(request_key=request_key).first()
        if same is not None:
            if same.trial_id != trial.pk:
                raise DomainError({"request_key": ["This form was already used on another trial."]})
            return same  # the double submit of a form already handled
    locked = Trial.objects.select_for_update().select_related("search__idea").get(pk=trial.pk)
    earlier = Review.objects.filter(trial=locked).select_related("reviewer").first()
    if earlier is not None:
        if request_key and earlier.request_key == request_key:
            return earlier  # the same form, submitted twice at once
        raise DomainError(
            f"Trial {locked.index} of search {locked.search_id} was already "
            f"{PAST[earlier.action]} by {earlier.reviewer.get_username()}."
        )
    why_not = selectors.why_not_candidate(locked)
    if why_not is not None:
        raise DomainError(f"Trial {locked.index} is not in the review queue: {why_not}.")

    errors: dict[str, list[str]] = {}

    def bad(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    cleaned_range: dict[str, list[int]] = {}
    if action == Review.Action.APPROVE:
        text = _text(text, "text", bad, required=None)
        cleaned_range = _clean_range(locked.search.idea.problem, shape_range, bad)
    elif action == Review.Action.VETO:
        text = _text(text, "text", bad, required="Say why you veto: the agent reads the reason.")
    elif action == Review.Action.SEND_BACK:
        text = _text(text, "text", bad, required="Write a note: the agent reads it.")
    else:
        bad("action", f"Unknown action {action!r}; use approve, veto or send_back.")
    if errors:
        raise DomainError(errors)

    prohibit = bool(prohibit) and action != Review.Action.APPROVE and bool(text)
    try:
        with transaction.atomic():
            review = Review.objects.create(
                trial=locked,
                action=action,
                reviewer=user,
                text=text,
                prohibit=prohibit,
                shape_range=cleaned_range,
                request_key=request_key,
            )
    except IntegrityError as exc:  # a concurrent submit of the same form won the race
        if request_key:
            same = Review.objects.filter(request_key=request_key, trial=locked).first()
            if same is not None:
                return same
        raise DomainError(
            f"Trial {locked.index} was decided concurrently; reload the page."
        ) from exc
    if prohibit:
        _add_prohibition(locked.search.idea_id, text)
    if action == Review.Action.APPROVE:
        _start_revalidation(review, locked)
    else:
        _tell_agent(review, locked)
    return review


def _tell_agent(review: Review, trial: Trial) -> None:
    """Hand a veto reason or note to the agent's prompt (docs/agent.md); the review pages read
    the same notes (`selectors.review_notes_for_search`)."""
    add_note(
        search=trial.search,
        trial=trial,
        kind="veto" if review.action == Review.Action.VETO else "note",
        text=f"trial {trial.index}: {review.text}",
        author=review.reviewer,
    )


def _add_prohibition(idea_id: int, text: str) -> None:
    idea = Idea.objects.select_for_update().get(pk=idea_id)
    line = " ".join(text.split())  # one line per prohibition
    if line and line not in idea.prohibition_list:
        idea.prohibitions = (idea.prohibitions.rstrip("\n") + "\n" + line).lstrip("\n") + "\n"
        idea.save(update_fields=["prohibitions"])


def _start_revalidation(review: Review, trial: Trial) -> None:
    kinds = list(trial.search.idea.target_kinds or []) or [trial.device_kind or "interpret"]
    for kind in kinds:
        reval = Revalidation.objects.create(review=review, kind=kind)
        _enqueue(reval, trial, attempt=1)
    rid = review.pk
    transaction.on_commit(lambda: enqueue_watch(rid))


def _enqueue(reval: Revalidation, trial: Trial, attempt: int) -> None:
    reval.job_id = f"autoweb-reval-{reval.pk}-a{attempt}"
    reval.attempts = attempt
    reval.save(update_fields=["job_id", "attempts"])
    kwargs = {
        "problem": trial.search.idea.problem,
        "source": trial.source,
        "shape_range": reval.review.shape_range,
        "revalidation_id": reval.pk,
    }
    kind, job_id = reval.kind, reval.job_id

    def go() -> None:
        enqueue_gpu_job(
            control.redis_conn(),
            kind,
            REVALIDATE_JOB,
            kwargs,
            job_id=job_id,
            timeout_s=JOB_TIMEOUT_S,
        )

    transaction.on_commit(go)


def enqueue_watch(review_id: int) -> None:
    """Start the approval's re-validation watcher (`library.watch`) on an orchestrator."""
    try:
        control.enqueue(control.redis_conn(), WATCH_REVIEW_JOB, review_id)
    except redis.RedisError as e:  # the review is saved; `poll` picks it up later
        log.warning("review %s: could not enqueue the re-validation watcher: %s", review_id, e)


# -- re-validation results --------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@transaction.atomic
def record_revalidation(*, revalidation: Revalidation, report: Any) -> Revalidation:
    """Passed or failed from the worker's report; a pass becomes a Release. Again: no change."""
    locked = Revalidation.objects.select_for_update().get(pk=revalidation.pk)
    if locked.terminal:
        return locked
    if not isinstance(report, Mapping):
        return fail_revalidation(
            revalidation=locked, reason=f"the worker returned no report ({type(report).__name__})"
        )
    report = storable_json(dict(report), error=DomainError)
    outcome = report.get("revalidation") if isinstance(report.get("revalidation"), dict) else {}
    passed = outcome.get("passed") is True and report.get("verdict") == "accepted"
    locked.report = report
    locked.reasons = [str(r) for r in outcome.get("reasons") or report.get("reasons") or []]
    if not passed and not locked.reasons:
        locked.reasons = ["re-validation did not pass"]
    locked.status = Revalidation.Status.PASSED if passed else Revalidation.Status.FAILED
    locked.finished_at = timezone.now()
    locked.save()
    if passed:
        _release(locked, report)
    return locked


@transaction.atomic
def fail_revalidation(*, revalidation: Revalidation, reason: str) -> Revalidation:
    locked = Revalidation.objects.select_for_update().get(pk=revalidation.pk)
    if locked.terminal:
        return locked
    locked.status = Revalidation.Status.FAILED
    locked.reasons = [reason]
    locked.finished_at = timezone.now()
    locked.save(update_fields=["status", "reasons", "finished_at"])
    return locked


def _release_shape(row: Mapping[str, Any]) -> dict[str, Any]:
    """One shape of the re-validation report, with who serves it (`kernels.engine.compose`):
    the kernel where it beat the faster baseline beyond both spreads, else that baseline."""
    entry = compose.serve_row(row)
    return {
        "label": row.get("label"),
        "shape": row.get("shape"),
        "candidate_ms": row.get("candidate_ms"),
        "speedup_eager": row.get("speedup_eager"),
        "speedup_compiled": row.get("speedup_compiled"),
        "eager_ms": entry["eager_ms"],
        "compiled_ms": entry["compiled_ms"],
        "serve": entry["serve"],
        "margin": entry["margin"],
    }


def _release(reval: Revalidation, report: dict[str, Any]) -> Release:
    review = reval.review
    trial = review.trial
    summary = report.get("summary") if isinstance(report.get("summary"), dict) else {}
    shapes = [_release_shape(row) for row in report.get("shapes") or [] if isinstance(row, dict)]
    release = Release(
        problem=trial.search.idea.problem,
        kind=reval.kind,
        dtype=str(report.get("dtype") or ""),
        shape_range=review.shape_range,
        source=trial.source,
        source_sha256=source_sha256(trial.source),
        trial=trial,
        revalidation=reval,
        speedup_eager=_number(summary.get("geomean_speedup_eager")),
        speedup_compiled=_number(summary.get("geomean_speedup_compiled")),
        geomean_ms=_number(summary.get("geomean_ms")),
        shapes=shapes,
        approver=review.reviewer,
    )
    release.count_dispatch()
    release.save()
    return release


def poll(*, review: Review, conn: redis.Redis | None = None) -> bool:
    """Record every finished re-validation job of `review`; re-run lost ones. True when none
    is left queued."""
    conn = conn or control.redis_conn()
    pending = list(review.revalidations.filter(status=Revalidation.Status.QUEUED))
    for reval in pending:
        queue = rq_queue(queue_name(reval.kind), conn)
        StartedJobRegistry(queue=queue).cleanup()  # jobs of dead workers become "failed"
        try:
            job = fetch_job(reval.job_id, conn)
            status = job.get_status(refresh=True)
        except NoSuchJobError:
            job, status = None, None
        if status == JobStatus.FINISHED:
            record_revalidation(revalidation=reval, report=job.return_value())
        elif status in (None, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
            why = "its job disappeared" if status is None else f"its job {status}"
            if reval.attempts >= MAX_ATTEMPTS:
                fail_revalidation(
                    revalidation=reval, reason=f"re-validation lost {reval.attempts} times ({why})"
                )
            else:
                with transaction.atomic():
                    locked = Revalidation.objects.select_for_update().get(pk=reval.pk)
                    if not locked.terminal:
                        _enqueue(locked, review.trial, attempt=locked.attempts + 1)
    return not review.revalidations.filter(status=Revalidation.Status.QUEUED).exists()


# -- releases ---------------------------------------------------------------------------------


@transaction.atomic
def revoke_release(*, release: Release, user: Any, reason: str) -> Release:
    """No longer dispatched (nor exported); the row stays for the audit trail. Again: no change."""
    _require_reviewer(user, "revoke releases")
    locked = Release.objects.select_for_update().get(pk=release.pk)
    if locked.revoked_at is not None:
        return locked
    errors: dict[str, list[str]] = {}
    reason = _text(
        reason,
        "reason",
        lambda f, m: errors.setdefault(f, []).append(m),
        required="Say why the release is revoked.",
    )
    if errors:
        raise DomainError(errors)
    locked.revoked_at = timezone.now()
    locked.revoked_by = user
    locked.revoke_reason = reason
    locked.save(update_fields=["revoked_at", "revoked_by", "revoke_reason"])
    return locked
