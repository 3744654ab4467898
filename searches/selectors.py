"""Reads for the pages: what the views show, gathered without writing anything."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Q
from django.http import Http404
from django.utils import timezone

from core import roles
from core.pagination import Page, page_number
from kernels import problems as registry
from kernels.engine.proposers import Tried
from kernels.protocol import source_sha256
from searches.models import FAILURES, Idea, Search, Trial, Worker


@dataclass
class ProblemListing:
    problems: list[dict[str, Any]] = field(default_factory=list)
    # One entry per problem that failed to load (a user's problem directory may hold a broken
    # module) or whose file is hidden by another of the same name: {"name", "path", "builtin",
    # "error"}. The pages show them instead of failing as a whole.
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def builtin(self) -> list[dict[str, Any]]:
        return [p for p in self.problems if p["builtin"]]

    @property
    def users(self) -> list[dict[str, Any]]:
        return [p for p in self.problems if not p["builtin"]]

    @property
    def broken(self) -> list[str]:
        """Problems of the registry that failed to load (not files hidden by another)."""
        loaded = {p["name"] for p in self.problems}
        return [e["name"] for e in self.errors if e["name"] and e["name"] not in loaded]


def _load_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def list_problems() -> ProblemListing:
    """Every problem of the registry, built-in and the user's (AUTOWEB_PROBLEM_DIRS)."""
    listing = ProblemListing()
    try:
        sources = registry.sources()
        shadowed = registry.shadowed()
    except registry.ProblemError as exc:
        listing.errors.append({"name": "", "path": "", "builtin": False, "error": str(exc)})
        return listing
    for name, path in sources.items():
        try:
            listing.problems.append(registry.load(name).to_dict())
        except (Exception, SystemExit) as exc:  # a problem module is user code: show it
            builtin = path.parent == registry.BUILTIN_DIR
            listing.errors.append(
                {"name": name, "path": str(path), "builtin": builtin, "error": _load_error(exc)}
            )
    for name, path, used in shadowed:
        why = "a built-in problem" if used.parent == registry.BUILTIN_DIR else str(used)
        listing.errors.append(
            {
                "name": name,
                "path": str(path),
                "builtin": False,
                "error": f"not loaded: {why} has the same name; rename this file",
            }
        )
    return listing


# -- searches and trials ----------------------------------------------------------------------

# Columns a list of trials never shows: loading them for 50 rows would move megabytes.
_HEAVY_TRIAL_FIELDS = ("source", "report", "prompt", "versions")
MAX_PER_PAGE = 200


def search_for_user(user: Any, search_id: Any) -> Search:
    """The search, for a user allowed to see it: PermissionDenied or Http404 otherwise."""
    if not roles.is_engineer(user):
        raise PermissionDenied("Only engineers may see searches.")
    try:
        return Search.objects.select_related("idea", "created_by", "incumbent").get(
            pk=int(search_id)
        )
    except (Search.DoesNotExist, TypeError, ValueError):
        raise Http404(f"No search {search_id}.") from None


_get_search_for_user = search_for_user


def trial_for_user(user: Any, search_id: Any, index: Any) -> Trial:
    search = search_for_user(user, search_id)
    try:
        return Trial.objects.select_related("search__idea", "parent").get(
            search=search, index=int(index)
        )
    except (Trial.DoesNotExist, TypeError, ValueError):
        raise Http404(f"No trial {index} in search {search_id}.") from None


def running_searches(limit: int = 50) -> list[Search]:
    """Searches not yet finished or failed, newest first."""
    return list(
        Search.objects.filter(status__in=Search.ACTIVE)
        .select_related("idea", "created_by", "incumbent")
        .defer(*(f"incumbent__{name}" for name in _HEAVY_TRIAL_FIELDS))
        .order_by("-created_at", "-id")[:limit]
    )


def recent_wins(limit: int = 10) -> list[Trial]:
    """Kept trials that were timed and beat a baseline (eager or torch.compile), the most
    recently judged first. A search keeps its first correct candidate as the incumbent even
    when it is slower than both, or untimed (the CPU interpreter): neither is a win."""
    beat_a_baseline = Q(speedup_eager__gt=1.0) | Q(speedup_compiled__gt=1.0)
    return list(
        Trial.objects.filter(beat_a_baseline, status=Trial.Status.KEPT, geomean_ms__isnull=False)
        .select_related("search__idea")
        .defer(*_HEAVY_TRIAL_FIELDS)
        .order_by("-finished_at", "-id")[:limit]
    )


@dataclass(kw_only=True)
class TrialPage(Page):
    trials: list[Trial]
    # Filtered or sorted otherwise than newest first: the live stream inserts no rows into it.
    narrowed: bool = False


# How the trial table can be sorted: key -> (label, order). "knob:NAME" sorts by a knob's value.
TRIAL_SORTS = {
    "newest": ("newest first", ("-index",)),
    "oldest": ("oldest first", ("index",)),
    "fastest": ("fastest (geomean)", ("geomean_ms",)),
    "eager": ("best vs eager", ("-speedup_eager",)),
    "compiled": ("best vs torch.compile", ("-speedup_compiled",)),
}
# Statuses the table filters on: a group of in-flight states, or one verdict.
TRIAL_STATUS_FILTERS = {
    "in_flight": ("in flight", Trial.IN_FLIGHT),
    "kept": ("kept", (Trial.Status.KEPT,)),
    "reverted": ("reverted", (Trial.Status.REVERTED,)),
    "failed": ("failed", (Trial.Status.FAILED,)),
}


@dataclass(kw_only=True)
class TrialQuery:
    """What the search page's trial table shows: filters (all must hold) and one order.

    `knobs` maps a knob's name to the value it must have (as the trial's `knob_values` stores
    it); `sort` is a `TRIAL_SORTS` key, or "knob:NAME" / "-knob:NAME" for a knob's value. The
    names come from a validated form (searches.forms.TrialFilterForm), never raw from a URL.
    """

    status: str = ""
    min_speedup: float | None = None  # vs eager
    knobs: dict[str, Any] = field(default_factory=dict)
    sort: str = "newest"

    @property
    def narrowed(self) -> bool:
        return bool(self.status or self.min_speedup is not None or self.knobs) or (
            self.sort != "newest"
        )

    def apply(self, trials: Any) -> Any:
        if self.status:
            trials = trials.filter(status__in=TRIAL_STATUS_FILTERS[self.status][1])
        if self.min_speedup is not None:
            trials = trials.filter(speedup_eager__gte=self.min_speedup)
        for name, value in self.knobs.items():
            trials = trials.filter(**{f"knob_values__{name}": value})
        return trials.order_by(*self.ordering())

    def ordering(self) -> list[Any]:
        from django.db.models import F
        from django.db.models.fields.json import KeyTransform

        if self.sort.lstrip("-").startswith("knob:"):
            name = self.sort.split(":", 1)[1]
            value = KeyTransform(name, "knob_values")  # JSON order: numbers numerically
            key = (
                value.desc(nulls_last=True)
                if self.sort.startswith("-")
                else value.asc(nulls_last=True)
            )
            return [key, "-index"]
        order = TRIAL_SORTS.get(self.sort, TRIAL_SORTS["newest"])[1]
        # Untimed trials (no numbers) go last whichever way a number sorts.
        keys = [
            F(o.lstrip("-")).desc(nulls_last=True)
            if o.startswith("-")
            else F(o).asc(nulls_last=True)
            for o in order
        ]
        return [*keys, "-index"] if order[0].lstrip("-") != "index" else keys


def trials_page(
    search: Search, page: Any = 1, per_page: int = 50, query: TrialQuery | None = None
) -> TrialPage:
    """One page of a search's trials, newest first (or as `query` filters and sorts them), in
    two queries whatever the search's size.

    The rows lack source, report and prompt (deferred): a list that shows one of them would
    load it row by row; the trial page loads the full row.
    """
    per_page = min(max(int(per_page), 1), MAX_PER_PAGE)
    query = query or TrialQuery()
    trials = query.apply(Trial.objects.filter(search=search))
    total = trials.count()
    page = page_number(page, total, per_page)
    start = (page - 1) * per_page
    rows = list(trials.defer(*_HEAVY_TRIAL_FIELDS)[start : start + per_page])
    return TrialPage(
        trials=rows, page=page, per_page=per_page, total=total, narrowed=query.narrowed
    )


def search_knobs(search: Search) -> list[Any]:
    """The `# tune:` knobs the search starts from (kernels.knobs.Knob: name, value, choices),
    in source order; none when the start source declares none or cannot be read."""
    from kernels.knobs import KnobError, parse_knobs

    try:
        return parse_knobs(search.idea.start_source())
    except (KnobError, SyntaxError, ValueError, KeyError, OSError):
        return []


def compare_trials(user: Any, search_id: Any, a: Any, b: Any) -> tuple[Trial, Trial]:
    """Two trials of one search, for a user allowed to see it (Http404 for a missing one)."""
    return trial_for_user(user, search_id, a), trial_for_user(user, search_id, b)


def trials_updated_since(search: Search, since: datetime, limit: int = 200) -> list[Trial]:
    """Trials changed after `since`, oldest change first: a reconnecting stream catches up."""
    return list(
        Trial.objects.filter(search=search, updated_at__gt=since)
        .defer(*_HEAVY_TRIAL_FIELDS)
        .order_by("updated_at", "id")[:limit]
    )


def in_flight_trials(search: Search) -> list[Trial]:
    """Trials proposed but not yet judged, oldest first (what a resumed orchestrator re-checks)."""
    return list(
        Trial.objects.filter(search=search)
        .exclude(status__in=Trial.TERMINAL)
        .defer("report", "prompt", "versions")
        .order_by("index")
    )


def trial_history(search: Search) -> list[dict[str, Any]]:
    """Every trial's knobs and outcome, in order: enough to rebuild the tuner's state."""
    return list(
        Trial.objects.filter(search=search)
        .order_by("index")
        .values(
            "id",
            "index",
            "status",
            "failure",
            "knob_values",
            "source_sha256",
            "geomean_ms",
            "noise",
        )
    )


def source_seen(search: Search, source: str) -> bool:
    return Trial.objects.filter(search=search, source_sha256=source_sha256(source)).exists()


def model_success_rates(search: Search | None = None) -> list[dict[str, Any]]:
    """Per proposer and model: trials, judged, kept, reverted, failed, success rate, best speedup.

    The success rate is kept / judged; the best speedup is over kept trials (vs eager).
    """
    trials = Trial.objects.all() if search is None else Trial.objects.filter(search=search)
    rows = (
        trials.values("proposer", "model")
        .annotate(
            total=Count("id"),
            kept=Count("id", filter=Q(status=Trial.Status.KEPT)),
            reverted=Count("id", filter=Q(status=Trial.Status.REVERTED)),
            failed=Count("id", filter=Q(status=Trial.Status.FAILED)),
            best_speedup_eager=Max("speedup_eager", filter=Q(status=Trial.Status.KEPT)),
        )
        .order_by("proposer", "model")
    )
    out = []
    for row in rows:
        judged = row["kept"] + row["reverted"] + row["failed"]
        out.append(
            {**row, "judged": judged, "success_rate": row["kept"] / judged if judged else None}
        )
    return out


def failure_taxonomy(search: Search) -> dict[str, int]:
    """Failed trials per category, every category present (zeros too), in the harness's order."""
    counts = dict(
        Trial.objects.filter(search=search, status=Trial.Status.FAILED)
        .values_list("failure")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {name: counts.get(name, 0) for name in FAILURES}


# -- workers ----------------------------------------------------------------------------------


def workers_online(now: datetime | None = None) -> list[Worker]:
    """Workers whose last heartbeat is within settings.AUTOWEB_WORKER_ONLINE_S."""
    since = (now or timezone.now()) - Worker.online_window()
    return list(Worker.objects.filter(last_heartbeat__gte=since).order_by("kind", "name"))


def all_workers() -> list[Worker]:
    return list(Worker.objects.order_by("kind", "name"))


# -- ideas ------------------------------------------------------------------------------------


def idea_for_user(user: Any, idea_id: Any) -> Idea:
    """The idea, for a user allowed to see it: PermissionDenied or Http404 otherwise."""
    if not roles.is_engineer(user):
        raise PermissionDenied("Only engineers may see ideas.")
    try:
        return Idea.objects.select_related("author").get(pk=int(idea_id))
    except (Idea.DoesNotExist, TypeError, ValueError):
        raise Http404(f"No idea {idea_id}.") from None


@dataclass(kw_only=True)
class IdeaPage(Page):
    ideas: list[Idea]


def ideas_page(page: Any = 1, per_page: int = 50) -> IdeaPage:
    """One page of ideas, newest first, each with its number of searches."""
    total = Idea.objects.count()
    page = page_number(page, total, per_page)
    start = (page - 1) * per_page
    rows = list(
        Idea.objects.select_related("author")
        .defer("description", "sketch_source", "prohibitions")
        .annotate(n_searches=Count("searches"))
        .order_by("-created_at", "-id")[start : start + per_page]
    )
    return IdeaPage(ideas=rows, page=page, per_page=per_page, total=total)


def searches_of_idea(idea: Idea, limit: int = 100) -> list[Search]:
    return list(
        Search.objects.filter(idea=idea)
        .select_related("incumbent")
        .defer(*(f"incumbent__{name}" for name in _HEAVY_TRIAL_FIELDS))
        .order_by("-created_at", "-id")[:limit]
    )


# -- problems ---------------------------------------------------------------------------------


def problem_detail(name: Any) -> dict[str, Any]:
    """Everything the problem page shows; Http404 for a name not in the registry."""
    try:
        known = registry.names()
    except registry.ProblemError as exc:
        raise Http404(str(exc)) from None
    if name not in known:
        raise Http404(f"No problem {name!r}.")
    path = registry.sources().get(name)
    try:
        problem = registry.load(name)
        data = problem.to_dict()
    except (Exception, SystemExit) as exc:  # a problem module is user code: show it
        return {"name": name, "path": str(path or ""), "error": _load_error(exc)}
    data["reference_source"] = problem.reference_source()
    data["seed_source"] = problem.seed_path.read_text() if problem.seed_path.is_file() else ""
    data["tolerances"] = {
        str(dtype).replace("torch.", ""): dict(tol)
        for dtype, tol in problem.module.TOLERANCE.items()
    }
    data["shape_rows"] = {tier: problem.shapes(tier) for tier in ("smoke", "full")}
    return data


def tried_of(search: Search, trials=None, parent: Trial | None = None) -> list[Tried]:
    """What the knob proposer has seen: the trials (all of the search's, or those given) and
    the variants skipped while tuning `parent`'s knobs (None: the search's start)."""
    rows = (
        trials if trials is not None else search.trials.only("knob_values", "geomean_ms", "status")
    )
    tried = [
        Tried(
            values=t.knob_values or {},
            geomean_ms=t.geomean_ms,
            failed=t.status == Trial.Status.FAILED,
            pending=t.status in Trial.IN_FLIGHT,
        )
        for t in rows
    ]
    tried += [
        Tried(values=e.get("values") or {}, geomean_ms=None, failed=False, skipped=True)
        for e in search.skipped or []
        if isinstance(e, dict) and e.get("parent") == (parent.index if parent else None)
    ]
    return tried


def problem_roofline(name: str, ceilings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each GPU-sweep shape's minimum bytes and flops (in the problem's GPU dtype), and its
    roofline floor on every GPU kind with measured ceilings (`fleet.measured_ceilings`)."""
    from kernels.harness.roofline import floor

    problem = registry.load(name)
    dtype = problem.dtype("cuda")
    rows = []
    for shape in problem.shapes("full"):
        row: dict[str, Any] = {"label": registry.shape_label(shape), "floors": []}
        try:
            nbytes, flops = problem.bytes(shape, dtype), problem.flops(shape)
        except Exception as exc:  # user code
            row["error"] = _load_error(exc)
            rows.append(row)
            continue
        row.update(bytes=nbytes, flops=flops, mbytes=nbytes / 1e6, gflop=flops / 1e9)
        for kind, c in sorted(ceilings.items()):
            f = floor(flops, nbytes, c)
            row["floors"].append(
                {"kind": kind, "floor_us": f["floor_ms"] * 1e3, "bound": f["bound"]}
            )
        rows.append(row)
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "kinds": [{"kind": k, **c} for k, c in sorted(ceilings.items())],
        "rows": rows,
    }


# -- the per-shape dispatch table -------------------------------------------------------------

SERVED_BY = {"kernel": "a generated kernel", "compiled": "torch.compile", "eager": "eager"}


def table_rows_of(search: Search) -> list[dict[str, Any]]:
    """The rows of the search's per-shape dispatch table (`Search.table`, built by
    `kernels.engine.compose.build`) as the search page and the review page show them: per
    shape its label, who serves it (`served_by` in words; `trial`, the serving trial's index,
    when a kernel does), that one's time, both baselines' times and the speedups. [] when the
    search has no table (not built yet, or its build failed)."""
    table = search.table if isinstance(search.table, dict) else {}
    rows = []
    for row in table.get("shapes") or []:
        if not isinstance(row, dict):
            continue
        serve = row.get("serve")
        kernel = row.get("kernel") if serve == "kernel" else None
        trial = kernel if isinstance(kernel, int) and not isinstance(kernel, bool) else None
        served_by = SERVED_BY.get(serve, "nobody (nothing was timed)")
        if kernel is not None and trial is None:  # a kernel named otherwise (a config)
            served_by = str(kernel)
        shape = row.get("shape") if isinstance(row.get("shape"), dict) else {}
        rows.append(
            {
                "label": row.get("label") or ",".join(f"{d}={v}" for d, v in shape.items()),
                "serve": serve or "none",
                "served_by": served_by,
                "trial": trial,
                "ms": row.get("ms"),
                "eager_ms": row.get("eager_ms"),
                "compiled_ms": row.get("compiled_ms"),
                "speedup_compiled": row.get("speedup_compiled"),
                "speedup_eager": row.get("speedup_eager"),
            }
        )
    return rows
