"""Reads: the review queue, a candidate's lineage, reviewer counts, notes for the agent, releases.

Queue rule (docs/review-and-library.md): a trial is a candidate when
- it was kept (accepted by the harness and faster than the incumbent of its time beyond the
  measured noise of both) and is still its search's incumbent (a later incumbent supersedes it),
- every check in its report passed or was not applicable (none failed),
- it beats the eager baseline by more than its own noise, and torch.compile too where that
  baseline was measured,
- no reviewer has decided on it yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, F, Max, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from core.pagination import Page, page_number
from library.models import Release, Revalidation, Review
from searches.models import Search, Trial

SORTS = {
    "speedup": lambda t: -(t.speedup_eager or 0.0),
    "-speedup": lambda t: t.speedup_eager or 0.0,
    "age": lambda t: -(t.finished_at or t.created_at).timestamp(),
    "-age": lambda t: (t.finished_at or t.created_at).timestamp(),
    "problem": lambda t: (t.search.idea.problem, -(t.speedup_eager or 0.0)),
    "search": lambda t: (t.search_id, t.index),
    "kind": lambda t: (t.device_kind, -(t.speedup_eager or 0.0)),
}
DEFAULT_SORT = "speedup"
MAX_AGE_DAYS = 36500  # the review queue's age filter, either way


def failed_checks(trial: Trial) -> list[str]:
    checks = (trial.report or {}).get("checks") or {}
    if not isinstance(checks, dict):
        return ["report has no readable checks"]
    return [
        str(name)
        for name, check in checks.items()
        if not isinstance(check, dict) or check.get("passed") is False
    ]


def why_not_candidate(trial: Trial) -> str | None:
    """None when the trial belongs in the queue (ignoring any decision); else the reason."""
    if trial.status != Trial.Status.KEPT:
        return f"the trial is {trial.status}, not kept"
    if trial.search.incumbent_id != trial.pk:
        return "a later trial replaced it as the search's incumbent"
    if (trial.report or {}).get("verdict") != "accepted":
        return "the harness did not accept it"
    failed = failed_checks(trial)
    if failed:
        return "failed checks: " + ", ".join(failed)
    noise = trial.noise
    if trial.speedup_eager is None or noise is None:
        return "no measured speedup and noise (untimed run)"
    if trial.speedup_eager <= 1 + noise:
        return f"not faster than eager beyond noise ({trial.speedup_eager:.3f}x, noise {noise:.1%})"
    if trial.speedup_compiled is not None and trial.speedup_compiled <= 1 + noise:
        return (
            f"not faster than torch.compile beyond noise ({trial.speedup_compiled:.3f}x, "
            f"noise {noise:.1%})"
        )
    return None


def _candidates() -> QuerySet[Trial]:
    return (
        Trial.objects.filter(
            status=Trial.Status.KEPT,
            search__incumbent_id=F("id"),
            speedup_eager__isnull=False,
            noise__isnull=False,
            speedup_eager__gt=1.0 + F("noise"),
        )
        .filter(Q(speedup_compiled__isnull=True) | Q(speedup_compiled__gt=1.0 + F("noise")))
        .select_related("search__idea", "imported")
    )


@dataclass
class Queue:
    trials: list[Trial]
    problems: list[str]
    kinds: list[str]
    sort: str
    filters: dict[str, Any]
    waiting: int = 0  # undecided candidates before the filters


def review_queue(
    *,
    problem: str | None = None,
    kind: str | None = None,
    search: int | None = None,
    min_speedup: float | None = None,
    max_age_days: float | None = None,
    sort: str = DEFAULT_SORT,
) -> Queue:
    """Undecided candidates, filtered and sorted (`sort` in SORTS; unknown: by speedup)."""
    base = _candidates().filter(review__isnull=True)
    everything = [t for t in base if why_not_candidate(t) is None]
    trials = everything
    if problem:
        trials = [t for t in trials if t.search.idea.problem == problem]
    if kind:
        trials = [t for t in trials if t.device_kind == kind]
    if search is not None:
        trials = [t for t in trials if t.search_id == search]
    if min_speedup is not None:
        trials = [t for t in trials if (t.speedup_eager or 0.0) >= min_speedup]
    if max_age_days is not None:
        # Past a century either way the filter means everything or nothing; timedelta refuses
        # more than 999999999 days.
        since = timezone.now() - timedelta(days=max(-MAX_AGE_DAYS, min(max_age_days, MAX_AGE_DAYS)))
        trials = [t for t in trials if (t.finished_at or t.created_at) >= since]
    sort = sort if sort in SORTS else DEFAULT_SORT
    trials.sort(key=SORTS[sort])
    return Queue(
        trials=trials,
        problems=sorted({t.search.idea.problem for t in everything}),
        kinds=sorted({t.device_kind for t in everything}),
        sort=sort,
        waiting=len(everything),
        filters={
            "problem": problem or "",
            "kind": kind or "",
            "search": search,
            "min_speedup": min_speedup,
            "max_age_days": max_age_days,
        },
    )


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def why_queue_is_empty(queue: Queue) -> list[str]:
    """Why the queue shows nothing, one line per cause with its count (none when it shows
    something): filters that hide candidates, no trials, untimed (interpreter) incumbents,
    incumbents that beat no baseline beyond noise, candidates already decided."""
    if queue.trials:
        return []
    if queue.waiting:
        return [
            f"{_n(queue.waiting, 'candidate waits', 'candidates wait')}, but none matches "
            "these filters."
        ]
    total = Trial.objects.count()
    if not total:
        return [
            "No trials yet: start a search, or import reports measured on a GPU "
            "(python manage.py import_reports)."
        ]
    lines = []
    incumbents = Trial.objects.filter(status=Trial.Status.KEPT, search__incumbent_id=F("id"))
    untimed = incumbents.filter(Q(speedup_eager__isnull=True) | Q(noise__isnull=True))
    interpreted = untimed.filter(device_kind="interpret").count()
    if interpreted:
        lines.append(
            f"{_n(interpreted, 'search has its', 'searches have their')} best trial from the "
            "CPU interpreter, which is never timed: only a timed win can be reviewed. Import "
            "reports measured on a GPU (python manage.py import_reports) to review them here."
        )
    other_untimed = untimed.count() - interpreted
    if other_untimed:
        lines.append(
            f"{_n(other_untimed, 'search has its', 'searches have their')} best trial untimed."
        )
    candidates = _candidates()
    no_win = incumbents.exclude(pk__in=untimed.values("pk")).exclude(pk__in=candidates.values("pk"))
    if no_win.exists():
        lines.append(
            f"{_n(no_win.count(), 'kept trial lacks', 'kept trials lack')} a baseline win: "
            "not faster than eager (and torch.compile, where measured) beyond the noise."
        )
    decided = candidates.filter(review__isnull=False).count()
    if decided:
        lines.append(
            f"{_n(decided, 'candidate was', 'candidates were')} already decided "
            "(approved, vetoed or sent back)."
        )
    undecided = [t for t in candidates.filter(review__isnull=True) if why_not_candidate(t)]
    if undecided:
        lines.append(
            f"{_n(len(undecided), 'candidate')} failed a check: "
            + "; ".join(sorted({why_not_candidate(t) or "" for t in undecided}))
            + "."
        )
    superseded = (
        Trial.objects.filter(status=Trial.Status.KEPT).exclude(search__incumbent_id=F("id"))
    ).count()
    if superseded:
        lines.append(
            f"{_n(superseded, 'kept trial was', 'kept trials were')} replaced by a faster "
            "one as its search's incumbent."
        )
    kept = Trial.objects.filter(status=Trial.Status.KEPT).count()
    if total - kept:
        lines.append(
            f"{_n(total - kept, 'trial was', 'trials were')} not kept (reverted, "
            "failed or still running)."
        )
    return lines


def review_status(trial: Trial) -> dict[str, Any]:
    """Where a trial stands with review: "decided" (with the review), "queued" (waiting for a
    reviewer), "out" (not a candidate: `why`), or "running" (no verdict yet)."""
    if not trial.terminal:
        return {"state": "running"}
    review = Review.objects.filter(trial=trial).select_related("reviewer").first()
    if review is not None:
        return {"state": "decided", "review": review}
    why = why_not_candidate(trial)
    return {"state": "queued"} if why is None else {"state": "out", "why": why}


# -- re-validation ----------------------------------------------------------------------------


def revalidation_states(revalidations: list[Revalidation]) -> dict[int, str]:
    """Per queued re-validation (by id), what it waits for: "awaiting re-validation on h200:
    no h200 worker is online (none online since ...)" when no worker of its GPU kind
    heartbeats in Redis, else "re-validating on h200 (N workers online)"."""
    queued = [r for r in revalidations if not r.terminal]
    if not queued:
        return {}
    import redis

    from kernels.queues import kind_last_seen
    from searches import fleet as fleets  # reads Redis; only when something waits

    now = fleets.fleet(registered=False)
    kinds = sorted({r.kind for r in queued})
    seen: dict[str, float | None] = {}
    if not now.redis_error:
        conn = fleets.connect()
        try:
            seen = {kind: kind_last_seen(conn, kind) for kind in kinds}
        except (redis.RedisError, OSError):
            now.redis_error = "unreachable"
        finally:
            conn.close()
    states = {}
    for reval in queued:
        kind = reval.kind
        online = [w for w in now.online if w.kind == kind]
        if now.redis_error:
            states[reval.pk] = (
                f"re-validation on {kind} is queued; whether a {kind} worker is online is "
                "unknown (Redis is unreachable)"
            )
        elif online:
            states[reval.pk] = f"re-validating on {kind} ({_n(len(online), 'worker')} online)"
        else:
            last = seen.get(kind)
            when = (
                "none online since "
                f"{timezone.localtime(datetime.fromtimestamp(last, tz=UTC)):%Y-%m-%d %H:%M %Z}"
                if last is not None
                else "none has been online"
            )
            states[reval.pk] = (
                f"awaiting re-validation on {kind}: no {kind} worker is online ({when}); it "
                "starts when one does (python -m kernels.worker on a host with that GPU)"
            )
    return states


def awaiting_revalidation() -> list[Revalidation]:
    """Re-validations still queued, oldest first, with their review and trial."""
    return list(
        Revalidation.objects.filter(status=Revalidation.Status.QUEUED)
        .select_related(
            "review__reviewer", "review__trial__search__idea", "review__trial__imported"
        )
        # One query, without the bulky JSON: the trial's report and source stay behind.
        .defer("report", "review__trial__report", "review__trial__source", "review__trial__prompt")
        .order_by("created_at", "id")
    )


def reviewer_counts() -> list[dict[str, Any]]:
    """Per reviewer: decisions of each kind, most active first."""
    rows = (
        Review.objects.values("reviewer__username")
        .annotate(
            total=Count("id"),
            approved=Count("id", filter=Q(action=Review.Action.APPROVE)),
            vetoed=Count("id", filter=Q(action=Review.Action.VETO)),
            sent_back=Count("id", filter=Q(action=Review.Action.SEND_BACK)),
        )
        .order_by("-total", "reviewer__username")
    )
    return [{**row, "reviewer": row.pop("reviewer__username")} for row in rows]


def lineage(trial: Trial, limit: int = 200) -> list[Trial]:
    """The trials that led here, oldest first, ending with `trial`."""
    chain = [trial]
    seen = {trial.pk}
    while chain[-1].parent_id is not None and len(chain) < limit:
        parent = Trial.objects.filter(pk=chain[-1].parent_id).first()
        if parent is None or parent.pk in seen:
            break
        seen.add(parent.pk)
        chain.append(parent)
    return list(reversed(chain))


def review_notes_for_search(search: Search) -> list[dict[str, Any]]:
    """Veto reasons and send-back notes on this search's trials, oldest first: the agent's
    context for its next proposal (the prompt builder reads this; prohibitions ticked by the
    reviewer are also in the idea's prohibitions)."""
    reviews = (
        Review.objects.filter(
            trial__search=search, action__in=(Review.Action.VETO, Review.Action.SEND_BACK)
        )
        .select_related("trial", "reviewer")
        .order_by("created_at", "id")
    )
    return [
        {
            "action": r.action,
            "trial": r.trial.index,
            "text": r.text,
            "prohibit": r.prohibit,
            "reviewer": r.reviewer.get_username(),
            "at": r.created_at.isoformat(),
        }
        for r in reviews
    ]


def review_notes_text(search: Search) -> str:
    """The notes as prompt text, one per line; empty when there are none."""
    lines = []
    for note in review_notes_for_search(search):
        what = "vetoed" if note["action"] == Review.Action.VETO else "sent back"
        lines.append(f"- A reviewer {what} trial {note['trial']}: {note['text']}")
    return "\n".join(lines)


# -- releases ---------------------------------------------------------------------------------

RELEASES_PER_PAGE = 50
RELEASE_STATES = ("active", "revoked")
RELEASE_FILTERS = ("problem", "kind", "state")
# Problem, GPU kind, newest first: a group's rows stay together across pages; the id breaks
# ties so that no row moves between pages from one request to the next.
RELEASE_ORDER = ("problem", "kind", "-created_at", "-id")
# What a row of the releases page shows. The source, the per-shape measurements and the whole
# trial (its report alone is ~20 KB of JSON) stay in the database.
_RELEASE_FIELDS = (
    "problem",
    "kind",
    "dtype",
    "shape_range",
    "speedup_eager",
    "speedup_compiled",
    "created_at",
    "revoked_at",
    "revoke_reason",
    "trial__index",
    "trial__search_id",
)
_RELEASE_ROW_FIELDS = (
    *_RELEASE_FIELDS,
    "dispatch_total",
    "dispatch_on_kernel",
    "approver__username",
    "revoked_by__username",
    # "imported from HOST (KIND)", for a trial imported from another host
    "trial__imported__host",
    "trial__imported__kind",
)
SERVED_BY = {"kernel": "the kernel", "compiled": "torch.compile", "eager": "eager"}


def release_filters(query: Any) -> dict[str, str]:
    """The releases page's filters from a querystring: problem, kind, state ('active',
    'revoked' or '' for both; anything else is ''). Blank filters are ''."""
    filters = {name: str(query.get(name) or "").strip() for name in RELEASE_FILTERS}
    if filters["state"] not in RELEASE_STATES:
        filters["state"] = ""
    return filters


def releases(
    *, problem: str | None = None, kind: str | None = None, state: str | None = None
) -> QuerySet[Release]:
    rows = Release.objects.all()
    if problem:
        rows = rows.filter(problem=problem)
    if kind:
        rows = rows.filter(kind=kind)
    if state == "active":
        rows = rows.filter(revoked_at__isnull=True)
    elif state == "revoked":
        rows = rows.filter(revoked_at__isnull=False)
    return rows


@dataclass(kw_only=True)
class ReleasePage(Page):
    groups: list[dict[str, Any]]


def releases_page(
    *,
    problem: str | None = None,
    kind: str | None = None,
    state: str | None = None,
    page: Any = 1,
    per_page: int = RELEASES_PER_PAGE,
) -> ReleasePage:
    """One page of releases grouped per (problem, kind), in three queries whatever their number.
    A page number that is not one, or past the end, gives the first or the last page."""
    rows = releases(problem=problem, kind=kind, state=state)
    total = rows.count()
    number = page_number(page, total, per_page)
    start = (number - 1) * per_page
    # The page's ids first: the offset then walks the release_page_order index, not joined rows.
    ids = list(rows.order_by(*RELEASE_ORDER).values_list("pk", flat=True)[start : start + per_page])
    shown = (
        Release.objects.filter(pk__in=ids)
        .select_related("trial__imported", "approver", "revoked_by")
        .only(*_RELEASE_ROW_FIELDS)
        .order_by(*RELEASE_ORDER)
    )
    groups: dict[tuple[str, str], list[Release]] = {}
    for rel in shown:
        groups.setdefault((rel.problem, rel.kind), []).append(rel)
    return ReleasePage(
        groups=[{"problem": p, "kind": k, "releases": v} for (p, k), v in groups.items()],
        page=number,
        per_page=per_page,
        total=total,
    )


def release_dispatch(release: Release) -> dict[str, Any]:
    """A release's per-shape dispatch table for the pages: per shape re-validation timed, who
    serves it (`served_by`, in words) and the kernel's, eager's and torch.compile's times, with
    how many shapes run the kernel. No rows for a release made before releases carried the
    table (the library runs its kernel on every shape of its range)."""
    rows = [
        {**row, "served_by": SERVED_BY.get(row["serve"], str(row["serve"]))}
        for row in release.dispatch()
    ]
    return {
        "rows": rows,
        "total": len(rows),
        "on_kernel": sum(1 for row in rows if row["serve"] == "kernel"),
    }


def release_kinds() -> list[str]:
    return list(Release.objects.order_by("kind").values_list("kind", flat=True).distinct())


def _best_active(rows: QuerySet[Release]) -> dict[tuple[str, str], Release]:
    """The best active release per (problem, kind) among `rows`, in two queries: the highest
    speedup vs eager, the newest among equals (and among releases with no speedup, when none
    of its group has one)."""
    active = rows.filter(revoked_at__isnull=True)
    best = active.values("problem", "kind").annotate(top=Max("speedup_eager")).order_by()
    match = Q(pk__in=[])
    for group in best:
        speed = (
            Q(speedup_eager=group["top"])
            if group["top"] is not None
            else Q(speedup_eager__isnull=True)
        )
        match |= Q(problem=group["problem"], kind=group["kind"]) & speed
    found: dict[tuple[str, str], Release] = {}
    for rel in (
        active.filter(match)
        .select_related("trial")
        .only(*_RELEASE_FIELDS)
        .order_by("-created_at", "-id")
    ):
        found.setdefault((rel.problem, rel.kind), rel)
    return found


def release_summary(*, problem: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
    """Per (problem, kind) over every release that matches the filters, not only one page's:
    how many there are, how many are active, and the best active one (None when none is)."""
    rows = releases(problem=problem, kind=kind)
    counts = (
        rows.values("problem", "kind")
        .annotate(total=Count("id"), active=Count("id", filter=Q(revoked_at__isnull=True)))
        .order_by("problem", "kind")
    )
    best = _best_active(rows)
    return [{**row, "best": best.get((row["problem"], row["kind"]))} for row in counts]


def released_speedups() -> list[dict[str, Any]]:
    """The best active release per (GPU kind, problem), for the charts (handed to
    `searches.hooks` in LibraryConfig.ready; docs/charts.md): rows {"kind", "problem",
    "speedup_eager", "speedup_compiled", "label", "url"}."""
    best = _best_active(Release.objects.all())
    by_kind = sorted(best, key=lambda key: (key[1], key[0]))
    return [
        {
            "kind": rel.kind,
            "problem": rel.problem,
            "speedup_eager": rel.speedup_eager,
            "speedup_compiled": rel.speedup_compiled,
            "label": f"release #{rel.pk} "
            f"(trial {rel.trial.index} of search #{rel.trial.search_id})",
            "url": reverse("library:review", args=[rel.trial_id]),
        }
        for rel in (best[key] for key in by_kind)
    ]
