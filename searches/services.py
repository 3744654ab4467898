"""Writes: every change to ideas, searches, trials and workers goes through these functions.

Each takes keyword arguments only, runs in one transaction and saves nothing when it raises.
Bad input raises a `core.errors.DomainError` (a ValidationError) whose message says what
to fix; a missing role raises `PermissionDenied`.

The orchestrator (an RQ job on the `search` queue) and the GPU workers drive a search only
through here, and may retry any call after a crash:

    search = begin_search(search=search)                  # queued -> running
    trial = record_proposal(search=search, source=..., parent=..., proposer=...)
    trial = screen_trial(trial=trial)                     # static checks; failed if they fail
    if not trial.terminal:
        trial = mark_trial_queued(trial=trial, job_id=new_id)   # enqueue on commit
    ... worker: mark_trial_phase(trial=..., phase="compiling"), "verifying", "benchmarking"
    trial = record_result(trial=trial, report=report, gpu_seconds=s)   # failed / reverted / kept,
                                        # or confirming: a screening win to re-time
    trial = record_confirmation(trial=trial, report=retimed)   # kept or reverted
    search = record_table(search=search, timed=...)     # the per-shape table, when stopping
    reason = check_budget(search=search)
    if reason: request_stop(search=search, reason=reason); finish_search(...) once none in flight

Functions that change a search lock its row first (`select_for_update`), then the trial's, in
that order everywhere, so concurrent results and proposals serialise instead of deadlocking.
They return fresh rows: the instance passed in may be stale afterwards.
"""

from __future__ import annotations

import logging
import math
import random
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from core import roles
from core.errors import DomainError, DuplicateCandidate, InvalidReport, UnknownWorker, redact
from core.storable import storable_json
from kernels import problems as registry
from kernels.engine import compose, judge
from kernels.harness.static import MAX_SOURCE_BYTES, check_source
from kernels.knobs import KnobError, parse_knobs
from kernels.protocol import rejected_report, source_sha256
from searches import crypto
from searches.agent import endpoints
from searches.models import (
    DEFAULT_PLATEAU_PATIENCE,
    FAILURES,
    LLM_PREFIX,
    MAX_GPU_MINUTES_CAP,
    MAX_TOKENS_CAP,
    MAX_TRIALS_CAP,
    MAX_WALL_MINUTES_CAP,
    TUNER,
    Idea,
    Search,
    StopReason,
    Trial,
    Worker,
)

log = logging.getLogger(__name__)

KIND_RE = re.compile(r"^[a-z0-9-]+$")
# gpt-4o, qwen2.5-coder:32b, meta-llama/Llama-3.1-70B-Instruct, claude-3-5-sonnet@20241022
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")
INTERPRET = "interpret"
MAX_KINDS = 8
MAX_TITLE = 200
MAX_DESCRIPTION = 20_000  # an idea's description: a few pages of Markdown, not a paper
MAX_TEXT = 100_000
MAX_REQUEST_KEY = 100
MAX_JOB_ID = 100
MAX_PLATEAU_PATIENCE = 100_000
UNTIMED_ON_INTERPRETER = judge.UNTIMED_ON_INTERPRETER

_UNCHANGED: Any = object()


# -- ideas ------------------------------------------------------------------------------------


def create_idea(
    *,
    author: Any,
    title: str,
    description: str,
    problem: str,
    target_kinds: list[str],
    proposer: str,
    sketch_source: str,
    prohibitions: str,
    max_trials: int,
    max_gpu_minutes: int,
    max_wall_minutes: int,
    max_tokens: int | None,
    context_packs: list[str] | None = None,
    llm_endpoint: str | None = None,
    llm_base_url: str | None = None,
    llm_api_key: str | None = None,
) -> Idea:
    """Validate everything, report every mistake at once (field -> messages), then save (one
    insert). The checks run outside any transaction: resolving a typed URL's host may wait on
    DNS, and no lock should wait with it.

    An `llm:<model>` idea names its endpoint: a declared one, or (where the operator allows
    it) a custom base URL with the key typed with it (searches/agent/endpoints.py)."""
    _require_engineer(author, "submit ideas")
    errors: dict[str, list[str]] = {}

    def bad(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    title = (title or "").strip()
    if not title:
        bad("title", "Give the idea a title.")
    elif len(title) > MAX_TITLE:
        bad("title", f"The title is {len(title)} characters; keep it within {MAX_TITLE}.")
    description = _text(description, "description", bad)
    if len(description) > MAX_DESCRIPTION:
        bad(
            "description",
            f"The description is {len(description):,} characters; keep it within "
            f"{MAX_DESCRIPTION:,}.",
        )
    prohibitions = _text(prohibitions, "prohibitions", bad)
    loaded = _clean_problem(problem, bad)
    kinds = _clean_kinds(target_kinds, bad)
    proposer = _clean_proposer(proposer, bad)
    budgets = {
        "max_trials": _whole(max_trials, "max_trials", "trials", MAX_TRIALS_CAP, bad),
        "max_gpu_minutes": _whole(
            max_gpu_minutes, "max_gpu_minutes", "GPU minutes", MAX_GPU_MINUTES_CAP, bad
        ),
        "max_wall_minutes": _whole(
            max_wall_minutes, "max_wall_minutes", "wall-clock minutes", MAX_WALL_MINUTES_CAP, bad
        ),
        "max_tokens": _whole(
            max_tokens, "max_tokens", "tokens", MAX_TOKENS_CAP, bad, optional=True
        ),
    }
    packs = _clean_packs(context_packs, bad)
    llm_fields = _clean_llm(proposer, llm_endpoint, llm_base_url, llm_api_key, bad)
    sketch = _text(sketch_source, "sketch_source", bad).replace("\r\n", "\n")
    if not sketch.strip():
        sketch = ""
    elif loaded is not None:
        _check_sketch(sketch, loaded, proposer, bad)
    if errors:
        raise DomainError(errors)
    return Idea.objects.create(
        author=author,
        title=title,
        description=description,
        problem=loaded.name,
        target_kinds=kinds,
        proposer=proposer,
        sketch_source=sketch,
        prohibitions=prohibitions,
        context_packs=packs,
        **llm_fields,
        **budgets,
    )


def _clean_llm(proposer: str, endpoint: Any, base_url: Any, api_key: Any, bad: Any) -> dict:
    if not proposer.startswith(LLM_PREFIX):
        return {}  # the tuner talks to no endpoint: whatever the form sent is not kept

    def bad_llm(field: str, message: str) -> None:  # the idea's own field names
        bad({"base_url": "llm_base_url", "api_key": "llm_api_key"}.get(field, field), message)

    target = endpoints.clean_target(endpoint, base_url, bad_llm) or endpoints.Target()
    key = endpoints.clean_key(api_key, bad_llm)
    return {**target.fields, "llm_api_key": crypto.encrypt(key)}


def _clean_packs(names: Any, bad: Any) -> list[str]:
    if not names:
        return []
    from searches.agent import packs

    known = packs.available("model")
    if isinstance(names, str) or not isinstance(names, list | tuple):
        bad("context_packs", "Give a list of model context pack names.")
        return []
    cleaned: list[str] = []
    for name in names:
        if name not in known:
            bad(
                "context_packs",
                f"{name!r} is not a model context pack; known: {', '.join(known) or 'none'}.",
            )
        elif name not in cleaned:
            cleaned.append(name)
    return cleaned


def _text(value: Any, field: str, bad: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        bad(field, f"Expected text, got {type(value).__name__}.")
        return ""
    if "\x00" in value:
        bad(field, "The text contains a NUL byte.")
        return ""
    if len(value) > MAX_TEXT:
        bad(field, f"The text is {len(value):,} characters; keep it within {MAX_TEXT:,}.")
        return ""
    return value


def _clean_problem(name: Any, bad: Any) -> registry.Problem | None:
    try:
        known = registry.names()
    except registry.ProblemError as exc:
        bad("problem", f"The problem registry cannot be read: {exc}")
        return None
    if name not in known:
        bad("problem", f"Unknown problem {name!r}; choose one of: {', '.join(known)}.")
        return None
    try:
        return registry.load(name)
    except Exception as exc:  # a problem module is user code: show whatever it raised
        bad("problem", f"Problem {name!r} failed to load: {type(exc).__name__}: {exc}")
        return None


def _clean_kinds(kinds: Any, bad: Any) -> list[str]:
    if isinstance(kinds, str) or not isinstance(kinds, list | tuple):
        bad("target_kinds", 'Give a list of GPU kinds, e.g. ["h200"] or ["interpret"].')
        return []
    if not kinds:
        bad("target_kinds", "Choose at least one target GPU kind.")
        return []
    if len(kinds) > MAX_KINDS:
        bad("target_kinds", f"At most {MAX_KINDS} GPU kinds, got {len(kinds)}.")
        return []
    cleaned: list[str] = []
    for kind in kinds:
        if not isinstance(kind, str) or not KIND_RE.match(kind) or len(kind) > 64:
            bad(
                "target_kinds",
                f"{kind!r} is not a GPU kind: use lowercase letters, digits and '-' "
                "(e.g. h200, a100-80gb, interpret).",
            )
        elif kind not in cleaned:
            cleaned.append(kind)
    return cleaned


def _clean_proposer(proposer: Any, bad: Any) -> str:
    if proposer == TUNER:
        return TUNER
    if isinstance(proposer, str) and proposer.startswith(LLM_PREFIX):
        model = proposer[len(LLM_PREFIX) :]
        if MODEL_RE.match(model) and len(proposer) <= 200:
            return proposer
        bad("proposer", f"{model!r} is not a model name (e.g. llm:gpt-4o, llm:qwen2.5-coder:32b).")
        return ""
    bad("proposer", f'Unknown proposer {proposer!r}: use "tuner" or "llm:<model>".')
    return ""


def _whole(
    value: Any, field: str, what: str, cap: int, bad: Any, *, optional: bool = False
) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if not optional:
            bad(field, f"Set a budget of {what}.")
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if number is None or not 1 <= number <= cap:
        bad(field, f"The budget of {what} must be a whole number from 1 to {cap:,}; got {value!r}.")
        return None
    return number


def _check_sketch(sketch: str, problem: registry.Problem, proposer: str, bad: Any) -> None:
    result = check_source(sketch, problem.arg_names)
    if not result.ok:
        bad(
            "sketch_source",
            f"The sketch fails the harness's static checks ({result.failure}): "
            + "; ".join(result.reasons),
        )
        return
    try:
        knobs = parse_knobs(sketch)
    except KnobError as exc:
        bad("sketch_source", f"The sketch's `# tune:` knobs: {exc}")
        return
    if proposer == TUNER and not knobs:
        bad(
            "sketch_source",
            "The tuner searches `# tune:` knobs and the sketch declares none; annotate a "
            "constant, e.g. `BLOCK_N = 1024  # tune: 512, 1024, 2048`.",
        )


# -- roles ------------------------------------------------------------------------------------


def _require_engineer(user: Any, action: str) -> None:
    if not roles.is_engineer(user):
        raise PermissionDenied(f"Only engineers may {action}.")


@transaction.atomic
def grant_role(*, user: Any, role: str) -> None:
    if role not in roles.ROLES:
        raise DomainError(
            {"role": [f"Unknown role {role!r}; use one of {', '.join(roles.ROLES)}."]}
        )
    group, _ = Group.objects.get_or_create(name=role)
    user.groups.add(group)
    user.__dict__.pop("_autoweb_groups", None)


def revoke_role(*, user: Any, role: str) -> None:
    if role not in roles.ROLES:
        raise DomainError(
            {"role": [f"Unknown role {role!r}; use one of {', '.join(roles.ROLES)}."]}
        )
    group = Group.objects.filter(name=role).first()
    if group is not None:
        user.groups.remove(group)
    user.__dict__.pop("_autoweb_groups", None)


# -- search lifecycle -------------------------------------------------------------------------


@transaction.atomic
def start_search(
    *,
    idea: Idea,
    user: Any,
    request_key: str | None = None,
    seed: int | None = None,
    plateau_patience: int = DEFAULT_PLATEAU_PATIENCE,
) -> Search:
    """A queued search on `idea`. The same `request_key` returns the search it first made."""
    _require_engineer(user, "start searches")
    if request_key is not None:
        request_key = str(request_key).strip()
        if not request_key or len(request_key) > MAX_REQUEST_KEY:
            raise DomainError(
                {"request_key": [f"A request key is 1 to {MAX_REQUEST_KEY} characters."]}
            )
        existing = Search.objects.filter(request_key=request_key).first()
        if existing is not None:
            return _same_request(existing, idea)
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise DomainError(
            {"seed": [f"The seed must be a whole number from 0 to 2**31-1; got {seed!r}."]}
        )
    if (
        isinstance(plateau_patience, bool)
        or not isinstance(plateau_patience, int)
        or not 1 <= plateau_patience <= MAX_PLATEAU_PATIENCE
    ):
        raise DomainError(
            {
                "plateau_patience": [
                    f"Plateau patience is a whole number of trials from 1 to "
                    f"{MAX_PLATEAU_PATIENCE:,}; got {plateau_patience!r}."
                ]
            }
        )
    try:
        with transaction.atomic():  # a savepoint: a lost race on request_key is recoverable
            return Search.objects.create(
                idea=idea,
                created_by=user,
                request_key=request_key,
                seed=seed,
                plateau_patience=plateau_patience,
                llm_endpoint=idea.llm_endpoint,
                llm_base_url=idea.llm_base_url,
                # The key typed with the idea is its author's: only their searches use it.
                llm_api_key=idea.llm_api_key if idea.author_id == user.pk else "",
            )
    except IntegrityError:
        if request_key is None:
            raise
        return _same_request(Search.objects.get(request_key=request_key), idea)


def _same_request(existing: Search, idea: Idea) -> Search:
    if existing.idea_id != idea.pk:
        raise DomainError(
            {
                "request_key": [
                    f"This request key already started search {existing.pk} on another idea."
                ]
            }
        )
    return existing


def _lock_search(search: Search | int) -> Search:
    pk = search.pk if isinstance(search, Search) else search
    return Search.objects.select_for_update().get(pk=pk)


@transaction.atomic
def begin_search(*, search: Search, now: datetime | None = None) -> Search:
    """The orchestrator picked the search up: queued -> running."""
    locked = _lock_search(search)
    locked.start(now or timezone.now())
    locked.save(update_fields=["status", "started_at"])
    return locked


@transaction.atomic
def pause_search(*, search: Search, user: Any) -> Search:
    _require_engineer(user, "pause searches")
    locked = _lock_search(search)
    locked.pause()
    locked.save(update_fields=["status"])
    return locked


@transaction.atomic
def resume_search(*, search: Search, user: Any) -> Search:
    _require_engineer(user, "resume searches")
    locked = _lock_search(search)
    locked.resume()
    locked.save(update_fields=["status", "stop_reason", "finished_at", "started_at"])
    return locked


@transaction.atomic
def stop_search(*, search: Search, user: Any) -> Search:
    """A user's stop: no new proposals; the orchestrator finishes it once none is in flight."""
    _require_engineer(user, "stop searches")
    locked = _lock_search(search)
    locked.request_stop(StopReason.USER)
    locked.save(update_fields=["status", "stop_reason"])
    return locked


@transaction.atomic
def request_stop(*, search: Search, reason: str) -> Search:
    """The orchestrator's stop (a budget, a plateau): like stop_search, with its reason."""
    reason = _reason(reason)
    locked = _lock_search(search)
    locked.request_stop(reason)
    locked.save(update_fields=["status", "stop_reason"])
    return locked


@transaction.atomic
def finish_search(*, search: Search, reason: str = "", now: datetime | None = None) -> Search:
    """Finished, with `reason` (or the reason given when stopping). Again: no change."""
    locked = _lock_search(search)
    if locked.status == Search.Status.FINISHED:
        return locked
    locked.finish(now or timezone.now(), reason.strip() if reason else "")
    locked.save(update_fields=["status", "stop_reason", "finished_at"])
    return locked


@transaction.atomic
def fail_search(*, search: Search, reason: str, now: datetime | None = None) -> Search:
    """Failed with "error: <reason>", from any state but finished. Again: no change."""
    reason = _reason(reason)
    locked = _lock_search(search)
    if locked.status == Search.Status.FAILED:
        return locked
    locked.fail(now or timezone.now(), reason)
    locked.save(update_fields=["status", "stop_reason", "finished_at"])
    # Every search-ending error reaches the log, never a key (the reason may quote a server).
    log.error("search %s failed: %s", locked.pk, redact(reason))
    return locked


def _reason(reason: Any) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise DomainError({"reason": ["Say why: the reason is shown to the search's owner."]})
    return reason.strip()


def check_budget(*, search: Search, now: datetime | None = None) -> str | None:
    """The reason to stop now (a spent budget or a plateau), or None to go on."""
    idea = search.idea
    if search.trials_total >= idea.max_trials:
        return f"{StopReason.BUDGET_TRIALS} ({search.trials_total} of {idea.max_trials})"
    if search.gpu_seconds >= idea.max_gpu_minutes * 60:
        used = search.gpu_seconds / 60
        return f"{StopReason.BUDGET_GPU_MINUTES} ({used:.1f} of {idea.max_gpu_minutes})"
    wall = search.wall_seconds(now or timezone.now())
    if wall >= idea.max_wall_minutes * 60:
        return f"{StopReason.BUDGET_WALL_TIME} ({wall / 60:.1f} of {idea.max_wall_minutes} minutes)"
    if idea.max_tokens is not None and search.tokens >= idea.max_tokens:
        return f"{StopReason.BUDGET_TOKENS} ({search.tokens} of {idea.max_tokens})"
    if (
        search.incumbent_id is not None
        and search.trials_since_improvement >= search.plateau_patience
    ):
        return (
            f"{StopReason.PLATEAU} ({search.trials_since_improvement} trials in a row "
            "without a new incumbent)"
        )
    return None


# -- trials -----------------------------------------------------------------------------------


@transaction.atomic
def record_proposal(
    *,
    search: Search,
    source: str,
    parent: Trial | None,
    proposer: str,
    model: str | None = None,
    rationale: str = "",
    knob_values: Mapping[str, Any] | None = None,
    prompt: str | None = None,
    tokens_in: int | None = None,
    tokens_out: int | None = None,
) -> Trial:
    """A new trial in `proposed`, numbered next in its search. Refuses a source already tried."""
    locked = _lock_search(search)
    idea = locked.idea
    if not locked.accepts_proposals:
        raise DomainError(f"Search {locked.pk} is {locked.status}: it takes no new trials.")
    if locked.trials_total >= idea.max_trials:
        raise DomainError(f"Search {locked.pk} has used its budget of {idea.max_trials} trials.")
    errors: dict[str, list[str]] = {}
    if not isinstance(source, str) or not source.strip():
        errors["source"] = ["The candidate source is empty."]
    elif "\x00" in source:
        errors["source"] = ["The candidate source contains a NUL byte."]
    elif len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        errors["source"] = [f"The candidate source is over {MAX_SOURCE_BYTES // 1024} KiB."]
    if parent is not None and parent.search_id != locked.pk:
        errors["parent"] = [
            f"The parent (trial {parent.index} of search {parent.search_id}) belongs to "
            "another search."
        ]
    if not isinstance(proposer, str) or not proposer.strip() or len(proposer) > 200:
        errors["proposer"] = ['Name the proposer ("tuner" or "llm:<model>").']
    if model is not None and (not isinstance(model, str) or not MODEL_RE.match(model)):
        errors["model"] = [f"{model!r} is not a model name."]
    if knob_values is not None and not isinstance(knob_values, Mapping):
        errors["knob_values"] = ["Knob values are a name -> value mapping."]
    for field, value in (("tokens_in", tokens_in), ("tokens_out", tokens_out)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31
        ):
            errors[field] = [f"A token count is a whole number >= 0; got {value!r}."]
    for field, value in (("rationale", rationale), ("prompt", prompt)):
        if value is not None and (not isinstance(value, str) or "\x00" in value):
            errors[field] = ["Expected text without NUL bytes."]
    if errors:
        raise DomainError(errors)

    digest = source_sha256(source)
    twin = locked.trials.filter(source_sha256=digest).values_list("index", flat=True).first()
    if twin is not None:
        raise DuplicateCandidate(
            {"source": [f"Search {locked.pk} already tried this exact source as trial {twin}."]}
        )
    last = locked.trials.aggregate(last=Max("index"))["last"] or 0
    trial = Trial.objects.create(
        search=locked,
        index=last + 1,
        parent=parent,
        source=source,
        source_sha256=digest,
        proposer=proposer.strip(),
        model=model,
        rationale=rationale or "",
        knob_values=storable_json(dict(knob_values or {}), error=DomainError),
        prompt=prompt,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
    )
    locked.trials_total += 1
    locked.tokens += (tokens_in or 0) + (tokens_out or 0)
    locked.save(update_fields=["trials_total", "tokens"])
    return trial


@transaction.atomic
def screen_trial(*, trial: Trial) -> Trial:
    """The harness's static checks before any GPU time: a failing trial is recorded as failed."""
    problem = registry.load(trial.search.idea.problem)
    result = check_source(trial.source, problem.arg_names)
    if result.ok:
        return trial
    return reject_trial(trial=trial, failure=result.failure or "malformed", reasons=result.reasons)


@transaction.atomic
def reject_trial(
    *, trial: Trial, failure: str, reasons: list[str], gpu_seconds: float = 0.0
) -> Trial:
    """Fail a trial without a worker's report (static checks, a job lost too many times)."""
    report = rejected_report(failure, reasons)
    return record_result(trial=trial, report=report, gpu_seconds=gpu_seconds)


@transaction.atomic
def mark_trial_queued(*, trial: Trial, job_id: str) -> Trial:
    """Queued under `job_id`; the same id again is no change, a new id is a retry (attempts+1)."""
    if not isinstance(job_id, str) or not job_id.strip() or len(job_id) > MAX_JOB_ID:
        raise DomainError({"job_id": [f"A job id is 1 to {MAX_JOB_ID} characters."]})
    locked = Trial.objects.select_for_update().get(pk=trial.pk)
    if not locked.queue(job_id.strip(), timezone.now()):
        return locked
    if Trial.objects.filter(job_id=locked.job_id).exclude(pk=locked.pk).exists():
        raise DomainError({"job_id": [f"Job {locked.job_id} already runs another trial."]})
    locked.save(
        update_fields=["status", "job_id", "attempts", "queued_at", "started_at", "updated_at"]
    )
    return locked


@transaction.atomic
def withdraw_trial(*, trial: Trial, job_id: str) -> Trial:
    """`job_id` was taken out of its GPU queue before any worker took it (`Trial.withdraw`).
    No change if the trial has moved on to another job since."""
    locked = Trial.objects.select_for_update().get(pk=trial.pk)
    if locked.job_id != job_id or locked.status not in (
        Trial.Status.QUEUED,
        Trial.Status.CONFIRMING,
    ):
        return locked
    locked.withdraw()
    locked.save(
        update_fields=["status", "job_id", "attempts", "queued_at", "confirmation", "updated_at"]
    )
    return locked


@transaction.atomic
def mark_trial_phase(*, trial: Trial, phase: str) -> Trial:
    """Progress from the worker. A phase that would go backwards, or a repeat, changes nothing."""
    if phase not in Trial.PHASES:
        raise DomainError({"phase": [f"{phase!r} is not a phase; use {', '.join(Trial.PHASES)}."]})
    locked = Trial.objects.select_for_update().get(pk=trial.pk)
    if locked.advance(phase, timezone.now()):
        locked.save(update_fields=["status", "started_at", "updated_at"])
    return locked


@transaction.atomic
def record_result(*, trial: Trial, report: Mapping[str, Any], gpu_seconds: float) -> Trial:
    """Judge a finished evaluation (`kernels.engine.judge.screen`): failed, reverted, kept
    (the first incumbent), or confirming: a win on screening numbers, which is kept only once
    an interleaved re-time against the incumbent confirms it (`record_confirmation`).

    Recording a trial that already has its verdict returns it unchanged, so an evaluation job
    that ran twice is counted once.
    """
    report = clean_report(report)
    if (
        isinstance(gpu_seconds, bool)
        or not isinstance(gpu_seconds, int | float)
        or not math.isfinite(gpu_seconds)
        or gpu_seconds < 0
    ):
        raise DomainError({"gpu_seconds": [f"GPU seconds must be >= 0; got {gpu_seconds!r}."]})
    search = _lock_search(trial.search_id)
    locked = Trial.objects.select_for_update().get(pk=trial.pk)
    if locked.terminal or locked.status == Trial.Status.CONFIRMING:
        return locked

    summary = report.get("summary") or {}
    device = report.get("device") or {}
    locked.report = report
    locked.device_kind = str(device.get("kind") or "")[:64]
    locked.device_name = str(device.get("name") or "")[:200]
    versions = device.get("versions")
    locked.versions = versions if isinstance(versions, dict) else {}
    locked.geomean_ms = _number(summary.get("geomean_ms"))
    locked.noise = _number(summary.get("noise"))
    locked.speedup_eager = _number(summary.get("geomean_speedup_eager"))
    locked.speedup_compiled = _number(summary.get("geomean_speedup_compiled"))
    locked.gpu_seconds = float(gpu_seconds)
    search.gpu_seconds += float(gpu_seconds)
    search.save(update_fields=["gpu_seconds"])

    if report["verdict"] == "rejected":
        locked.failure = report["failure"]
        locked.reasons = list(report["reasons"]) or [report["failure"]]
        return _conclude(search, locked, Trial.Status.FAILED)
    incumbent = search.incumbent
    verdict = judge.screen(locked.numbers(), incumbent.numbers() if incumbent else None)
    locked.failure = None
    locked.reasons = [verdict.reason]
    if verdict.status == judge.CONFIRM:
        locked.status = Trial.Status.CONFIRMING
        locked.job_id = None  # the confirmation gets a job of its own (orchestrator)
        locked.confirmation = {
            "against": incumbent.pk,
            "against_index": incumbent.index,
            "screened": verdict.reason,
        }
        locked.save()
        return locked
    return _conclude(search, locked, verdict.status)


@transaction.atomic
def record_confirmation(*, trial: Trial, report: Any) -> Trial:
    """Keep or revert a confirming trial from its interleaved re-time (`kernels.engine.judge.
    confirm`). `report` is the worker's [incumbent, challenger] numbers, or anything else for
    a re-time that failed (reverted: an unconfirmed win is not a win).

    When another trial was kept meanwhile, the re-time was against an old incumbent: the trial
    is screened again against the new one and, if still a win, waits for a new confirmation.
    """
    search = _lock_search(trial.search_id)
    locked = Trial.objects.select_for_update().get(pk=trial.pk)
    if locked.status != Trial.Status.CONFIRMING:
        return locked
    confirmation = dict(locked.confirmation or {})
    incumbent = search.incumbent
    if incumbent is None or incumbent.pk != confirmation.get("against"):
        return _rescreen(search, locked, incumbent)
    screened = judge.Verdict(judge.CONFIRM, confirmation.get("screened") or "")
    pair = report if isinstance(report, list) else None
    if pair is not None:
        confirmation["retimed"] = storable_json(
            {"incumbent": pair[0], "challenger": pair[1]} if len(pair) == 2 else pair,
            error=InvalidReport,
        )
    if isinstance(report, Mapping) and report.get("error"):
        verdict = judge.unconfirmed(screened, f"re-time failed: {str(report['error'])[:300]}")
    else:
        verdict = judge.confirm(screened, pair)
    locked.confirmation = confirmation
    locked.reasons = [verdict.reason]
    return _conclude(search, locked, verdict.status)


def _rescreen(search: Search, trial: Trial, incumbent: Trial | None) -> Trial:
    verdict = judge.screen(trial.numbers(), incumbent.numbers() if incumbent else None)
    trial.reasons = [verdict.reason]
    if verdict.status != judge.CONFIRM:
        return _conclude(search, trial, verdict.status)
    trial.job_id = None
    trial.confirmation = {
        "against": incumbent.pk,
        "against_index": incumbent.index,
        "screened": verdict.reason,
    }
    trial.save()
    return trial


def _conclude(search: Search, trial: Trial, status: str) -> Trial:
    """A verdict for a trial of `search` (both rows locked), with the search's counters."""
    trial.conclude(status, timezone.now())
    trial.save()
    if status == Trial.Status.KEPT:
        search.incumbent = trial
        search.trials_kept += 1
        search.trials_since_improvement = 0
    else:
        if status == Trial.Status.FAILED:
            search.trials_failed += 1
        if search.incumbent_id is not None:
            search.trials_since_improvement += 1
    search.save(
        update_fields=["incumbent", "trials_kept", "trials_failed", "trials_since_improvement"]
    )
    return trial


@transaction.atomic
def mark_confirmation_queued(*, trial: Trial, job_id: str) -> Trial:
    """The confirming trial's re-time job was enqueued under `job_id` (on commit)."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID:
        raise DomainError({"job_id": ["A job id is 1-100 characters."]})
    locked = Trial.objects.select_for_update().get(pk=trial.pk)
    if locked.status != Trial.Status.CONFIRMING:
        raise DomainError(f"trial {locked.index} is {locked.status}, not confirming")
    if locked.job_id != job_id:
        # `attempts` counts evaluations; re-time attempts are counted in `confirmation`.
        locked.job_id = job_id
        locked.save(update_fields=["job_id", "updated_at"])
    return locked


@transaction.atomic
def skip_variant(
    *, search: Search, values: Mapping[str, Any], reason: str, parent: Trial | None = None
) -> Search:
    """A knob variant the tuner did not evaluate (its source repeats an earlier trial's):
    recorded with the reason, shown on the search page, and counted as tried. `parent`: the
    LLM candidate whose knobs were being tuned (None: the search's own start)."""
    locked = _lock_search(search)
    entry = {
        "values": storable_json(dict(values), error=DomainError),
        "reason": _reason(reason)[:500],
        "parent": parent.index if parent is not None else None,
        "at": timezone.now().isoformat(),
    }
    same = (entry["values"], entry["parent"])
    if not any((e.get("values"), e.get("parent")) == same for e in locked.skipped):
        locked.skipped = [*locked.skipped, entry]
        locked.save(update_fields=["skipped"])
    return locked


@transaction.atomic
def set_strategy(*, search: Search, strategy: str) -> Search:
    locked = _lock_search(search)
    text = _reason(strategy)[:500]
    if locked.strategy != text:
        locked.strategy = text
        locked.save(update_fields=["strategy"])
    return locked


@transaction.atomic
def mark_table_queued(*, search: Search, job_id: str | None) -> Search:
    locked = _lock_search(search)
    locked.table_job_id = job_id
    locked.save(update_fields=["table_job_id"])
    return locked


@transaction.atomic
def record_table(*, search: Search, timed: Any, kernels: list[int]) -> Search:
    """The search's per-shape dispatch table (`kernels.engine.compose.build`) from the worker's
    interleaved timing of the chosen trials (`kernels` are their indices) and the baselines;
    anything unusable is recorded as the table's error, so the search can still finish."""
    locked = _lock_search(search)
    try:
        table = compose.build(
            timed["labels"],
            timed["shapes"],
            kernels,
            timed["kernels"],
            timed["baselines"],
        )
        if timed.get("verdict") != "accepted":
            table["note"] = "; ".join(str(r) for r in timed.get("reasons") or [])[:1000]
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        error = timed.get("error") if isinstance(timed, Mapping) else None
        table = {"error": str(error or f"the worker's timings were not usable: {e}")[:500]}
    locked.table = storable_json(table, error=InvalidReport)
    locked.table_job_id = None
    locked.save(update_fields=["table", "table_job_id"])
    return locked


def clean_report(report: Any) -> dict[str, Any]:
    """A harness report (a worker's, or an imported one) checked and made storable;
    InvalidReport when it is not one."""
    if not isinstance(report, Mapping):
        raise InvalidReport(f"A report is a JSON object; got {type(report).__name__}.")
    verdict = report.get("verdict")
    if verdict not in ("accepted", "rejected"):
        raise InvalidReport(
            f'The report\'s verdict must be "accepted" or "rejected"; got {verdict!r}.'
        )
    failure = report.get("failure")
    if verdict == "rejected" and failure not in FAILURES:
        raise InvalidReport(
            f"A rejected report names its failure, one of {', '.join(FAILURES)}; got {failure!r}."
        )
    if verdict == "accepted" and failure is not None:
        raise InvalidReport(f"An accepted report has no failure; got {failure!r}.")
    reasons = report.get("reasons") or []
    if not isinstance(reasons, list):
        raise InvalidReport("The report's reasons are a list of strings.")
    for key in ("summary", "device", "checks"):
        if report.get(key) is not None and not isinstance(report.get(key), Mapping):
            raise InvalidReport(f"The report's {key} is a JSON object.")
    shapes = report.get("shapes")
    if shapes is not None and not isinstance(shapes, list):  # odd entries: readers skip them
        raise InvalidReport("The report's shapes are a list, one entry per shape.")
    kind = (report.get("device") or {}).get("kind")
    if kind is not None and (
        not isinstance(kind, str) or not KIND_RE.match(kind) or len(kind) > 64
    ):
        raise InvalidReport(
            f"The report's device kind must be like h200 or a100-80gb; got {kind!r}."
        )
    summary = report.get("summary") or {}
    ms, noise = _number(summary.get("geomean_ms")), _number(summary.get("noise"))
    if ms is not None and ms <= 0:
        raise InvalidReport(f"The report's geomean_ms must be above 0; got {ms!r}.")
    if noise is not None and noise < 0:
        raise InvalidReport(f"The report's noise must be 0 or more; got {noise!r}.")
    cleaned = storable_json(dict(report), error=InvalidReport)
    cleaned["reasons"] = [str(r) for r in cleaned.get("reasons") or []]
    return cleaned


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# -- workers ----------------------------------------------------------------------------------


@transaction.atomic
def upsert_worker(
    *,
    name: str,
    kind: str,
    device_name: str,
    ceilings: Mapping[str, Any] | None,
    versions: Mapping[str, Any] | None,
    queue: str,
    now: datetime | None = None,
) -> Worker:
    """Register a GPU worker, or update the one of that name; counts as a heartbeat."""
    errors: dict[str, list[str]] = {}
    name = name.strip() if isinstance(name, str) else ""
    if not name or len(name) > 200:
        errors["name"] = ["A worker name is 1 to 200 characters, e.g. host:gpu0."]
    if not isinstance(kind, str) or not KIND_RE.match(kind) or len(kind) > 64:
        errors["kind"] = [f"{kind!r} is not a GPU kind (lowercase letters, digits and '-')."]
    elif queue != f"gpu.{kind}":
        errors["queue"] = [f"A {kind} worker serves the queue gpu.{kind}; got {queue!r}."]
    for field, value in (("ceilings", ceilings), ("versions", versions)):
        if value is not None and not isinstance(value, Mapping):
            errors[field] = [f"{field} is a JSON object."]
    if errors:
        raise DomainError(errors)
    worker, _ = Worker.objects.update_or_create(
        name=name,
        defaults={
            "kind": kind,
            "device_name": str(device_name or "")[:200],
            "ceilings": storable_json(dict(ceilings), error=DomainError) if ceilings else None,
            "versions": storable_json(dict(versions or {}), error=DomainError),
            "queue": queue,
            "last_heartbeat": now or timezone.now(),
        },
    )
    return worker


@transaction.atomic
def heartbeat(
    *, name: str, current_job_id: str | None = _UNCHANGED, now: datetime | None = None
) -> Worker:
    """The worker is alive (and, when given, busy with `current_job_id`, or idle for None)."""
    fields: dict[str, Any] = {"last_heartbeat": now or timezone.now()}
    if current_job_id is not _UNCHANGED:
        fields["current_job_id"] = current_job_id
    if not Worker.objects.filter(name=name).update(**fields):
        raise UnknownWorker(f"No worker named {name!r} has registered; register it first.")
    return Worker.objects.get(name=name)
