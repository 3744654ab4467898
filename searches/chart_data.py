"""Reads for the charts: rows gathered from the database for the pure builders in
`searches.charts`. Aggregation happens in SQL where it can, and no selector here loads more than
a bounded number of full reports, so a search of 10,000 trials costs a few small queries.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.db import NotSupportedError
from django.db.models import CharField, Count, F, Func, Max, Min, Window
from django.db.models.functions import RowNumber, Substr
from django.urls import reverse

from searches import hooks
from searches.models import Search, Trial, Worker

INTERPRET = "interpret"
ACCEPTED = (Trial.Status.KEPT, Trial.Status.REVERTED)
LABEL_CHARS = 80
# The roofline draws the fastest candidates of each problem: all of a problem's candidates sit
# at one intensity, so the fastest show how close to the roof it got; the rest are counted.
ROOFLINE_PER_PROBLEM = 100
HEATMAP_KERNELS = 8
CROSS_GPU_KERNELS = 20
REPORTS_SCANNED = 20


def trial_url(search_id: int, index: int) -> str:
    return reverse("searches:trial", args=[search_id, index])


def _label(row: dict[str, Any]) -> str:
    text = f"trial {row['index']} of search #{row['search_id']}"
    rationale = (row.get("short") or "").strip().splitlines()
    return f"{text}: {plotly_text(rationale[0][:LABEL_CHARS])}" if rationale else text


def plotly_text(text: str) -> str:
    """`text` as plotly.js shows it literally: plotly renders a subset of HTML in labels and
    titles (<a href>, <span style>, <b>), and rationales and shape labels are written by models
    and workers. plotly decodes &lt; &gt; &amp; back for display."""
    return html.escape(text, quote=False)


def _shapes(report: Any) -> list[dict[str, Any]]:
    """A stored report's per-shape rows that are objects (a report is the worker's word)."""
    shapes = report.get("shapes") if isinstance(report, dict) else None
    return [s for s in shapes if isinstance(s, dict)] if isinstance(shapes, list) else []


def _positive(value: Any) -> float | None:
    """A finite number > 0, or None (NaN and infinities are stored as strings)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


# -- GPU kinds --------------------------------------------------------------------------------


def gpu_kinds() -> list[str]:
    """Every GPU kind a worker registered as or a trial ran on (the CPU interpreter last)."""
    # order_by(): the model's default ordering would make DISTINCT run over (kind, search,
    # index), one row per trial.
    kinds = set(Worker.objects.order_by().values_list("kind", flat=True).distinct())
    kinds |= set(
        Trial.objects.exclude(device_kind="")
        .order_by()
        .values_list("device_kind", flat=True)
        .distinct()
    )
    kinds |= {r["kind"] for r in releases()}
    kinds.discard("")
    return sorted(kinds, key=lambda k: (k == INTERPRET, k))


def ceilings_by_kind(kinds: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Measured ceilings per kind: the most recently seen worker that has them, else the device
    block of the newest report that carries them. `kinds`: `gpu_kinds()` if the caller has it."""
    found: dict[str, dict[str, Any]] = {}
    for kind, ceilings in (
        Worker.objects.exclude(ceilings=None)
        .order_by("kind", "-last_heartbeat")
        .values_list("kind", "ceilings")
    ):
        if isinstance(ceilings, dict) and kind not in found:
            found[kind] = ceilings
    for kind in set(kinds if kinds is not None else gpu_kinds()) - set(found) - {INTERPRET}:
        # Ids first, newest first, then only one device block at a time: sorting rows that
        # carry whole reports (22 KB each) cost more than the rest of the page.
        newest = (
            Trial.objects.filter(device_kind=kind, status__in=ACCEPTED)
            .order_by("-finished_at", "-id")
            .values_list("id", flat=True)[:REPORTS_SCANNED]
        )
        for pk in list(newest):
            device = Trial.objects.filter(pk=pk).values_list("report__device", flat=True).first()
            ceilings = device.get("ceilings") if isinstance(device, dict) else None
            if isinstance(ceilings, dict):
                found[kind] = ceilings
                break
    return found


# -- releases ------------------------------------------------------------------------------------


def releases() -> list[dict[str, Any]]:
    """Released kernels, one row per (GPU kind, problem): ``{"kind", "problem",
    "speedup_eager", "speedup_compiled", "label", "url"}``, from the app that provides them
    (the library app, through `searches.hooks`)."""
    return hooks.released_speedups()


def releases_by_kind() -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in releases():
        by_kind[row["kind"]].append(row)
    return dict(by_kind)


# -- best found --------------------------------------------------------------------------------


def best_found_by_kind(problem: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per GPU kind, per problem: the best kept trial's speedups (vs eager and vs torch.compile,
    each the best over that problem's kept trials on that kind), linked to the best vs eager."""
    trials = Trial.objects.filter(status=Trial.Status.KEPT).exclude(device_kind__in=("", INTERPRET))
    if problem is not None:
        trials = trials.filter(search__idea__problem=problem)
    groups = (
        trials.values("device_kind", "search__idea__problem")
        .annotate(eager=Max("speedup_eager"), compiled=Max("speedup_compiled"))
        .order_by("device_kind", "search__idea__problem")
    )
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for group in groups:
        if group["eager"] is None and group["compiled"] is None:
            continue
        kind, name = group["device_kind"], group["search__idea__problem"]
        best = (
            trials.filter(device_kind=kind, search__idea__problem=name)
            .exclude(speedup_eager=None)
            .order_by("-speedup_eager", "id")
            .annotate(short=Substr("rationale", 1, LABEL_CHARS))
            .values("search_id", "index", "short")
            .first()
        )
        out[kind].append(
            {
                "problem": name,
                "speedup_eager": group["eager"],
                "speedup_compiled": group["compiled"],
                "label": _label(best) if best else "",
                "url": trial_url(best["search_id"], best["index"]) if best else "",
            }
        )
    return dict(out)


# -- one search --------------------------------------------------------------------------------


def progress_rows(search: Search) -> list[dict[str, Any]]:
    """Every trial of the search in index order, without the heavy columns."""
    rows = (
        Trial.objects.filter(search=search)
        .order_by("index")
        .annotate(short=Substr("rationale", 1, LABEL_CHARS))
        .values("search_id", "index", "status", "failure", "speedup_eager", "short")
    )
    return [
        {
            "index": r["index"],
            "status": r["status"],
            "failure": r["failure"],
            "speedup_eager": r["speedup_eager"],
            "label": _label(r),
            "url": trial_url(r["search_id"], r["index"]),
        }
        for r in rows
    ]


def knob_rows(search: Search, limit: int = 2000) -> list[dict[str, Any]]:
    """The newest timed trials of the search (at most `limit`): index, knob values, speedup."""
    rows = (
        Trial.objects.filter(search=search, status__in=ACCEPTED, geomean_ms__isnull=False)
        .order_by("-index")
        .values_list("index", "knob_values", "speedup_eager")[:limit]
    )
    return [{"index": i, "values": v, "speedup_eager": s} for i, v, s in rows]


def burndown_events(search: Search) -> list[dict[str, Any]]:
    """Judged trials in the order they finished: minute since the search started, GPU seconds,
    tokens."""
    if search.started_at is None:
        return []
    rows = (
        Trial.objects.filter(search=search, status__in=Trial.TERMINAL)
        .exclude(finished_at=None)
        .order_by("finished_at", "id")
        .values_list("finished_at", "gpu_seconds", "tokens_in", "tokens_out")
    )
    return [
        {
            "minute": max(0.0, (finished - search.started_at).total_seconds() / 60),
            "gpu_seconds": gpu,
            "tokens": (tin or 0) + (tout or 0),
        }
        for finished, gpu, tin, tout in rows
    ]


# -- failure taxonomy --------------------------------------------------------------------------


def _outcome(status: str, failure: str | None) -> str:
    return failure or ("failed" if status == Trial.Status.FAILED else status)


def _judged(search: Search | None = None, kind: str | None = None):
    trials = Trial.objects.filter(status__in=Trial.TERMINAL)
    if search is not None:
        trials = trials.filter(search=search)
    if kind is not None:
        trials = trials.filter(device_kind=kind)
    return trials


def proposer_label(proposer: str, model: str | None) -> str:
    if model and model not in proposer:
        return f"{proposer} · {model}"
    return proposer


def outcome_counts(search: Search | None = None, kind: str | None = None) -> list[dict[str, Any]]:
    """Judged trials counted per proposer / model and outcome (kept, reverted, or the failure
    category)."""
    rows = (
        _judged(search, kind)
        .values("proposer", "model", "status", "failure")
        .annotate(n=Count("id"))
        .order_by()
    )
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for r in rows:
        group = proposer_label(r["proposer"], r["model"])
        totals[(group, _outcome(r["status"], r["failure"]))] += r["n"]
    return [{"group": g, "outcome": o, "count": n} for (g, o), n in sorted(totals.items())]


def outcome_counts_over_time(
    search: Search | None = None, kind: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Judged trials per time bucket and outcome; hourly buckets over spans up to two days,
    daily ones beyond. Returns (rows, "hour" or "day")."""
    trials = _judged(search, kind).exclude(finished_at=None)
    span = trials.aggregate(first=Min("finished_at"), last=Max("finished_at"))
    if span["first"] is None:
        return [], "hour"
    hourly = span["last"] - span["first"] <= timedelta(days=2)
    rows = (
        trials.annotate(bucket=UTCBucket("finished_at", hourly=hourly))
        .values("bucket", "status", "failure")
        .annotate(n=Count("id"))
        .order_by()
    )
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for r in rows:
        totals[(r["bucket"], _outcome(r["status"], r["failure"]))] += r["n"]
    rows = [{"group": g, "outcome": o, "count": n} for (g, o), n in sorted(totals.items())]
    return rows, "hour" if hourly else "day"


class UTCBucket(Func):
    """The UTC hour ("2026-12-02 13:00") or day ("2026-12-02") of a timestamp, as text, computed
    by the database: Django's TruncHour on SQLite calls back into Python once per row, which
    was most of the dashboard charts' time with 10,000 trials."""

    output_field = CharField()

    def __init__(self, expression: Any, *, hourly: bool) -> None:
        super().__init__(expression)
        self.hourly = hourly

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Django stores aware datetimes in SQLite as UTC text, "YYYY-MM-DD HH:MM:SS[.ffffff]".
        sql, params = compiler.compile(self.source_expressions[0])
        fmt = "%Y-%m-%d %H:00" if self.hourly else "%Y-%m-%d"
        return f"strftime(%s, {sql})", (fmt, *params)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        fmt = "YYYY-MM-DD HH24:00" if self.hourly else "YYYY-MM-DD"
        return f"to_char(({sql}) AT TIME ZONE 'UTC', %s)", (*params, fmt)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        raise NotSupportedError(f"time buckets on {connection.vendor}")


# -- roofline ----------------------------------------------------------------------------------


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def problem_work(report: dict[str, Any] | None) -> dict[str, float] | None:
    """Geometric means over a report's shapes of the FLOPs and minimum bytes the problem
    defines for each shape (recovered from the harness's per-shape ms, GB/s and TFLOP/s, which
    it computed from the problem's `flops` and `bytes`)."""
    flops, nbytes = [], []
    for shape in _shapes(report):
        ms, tflops, gbps = (_positive(shape.get(k)) for k in ("candidate_ms", "tflops", "gbps"))
        if not (ms and tflops and gbps):
            return None
        flops.append(tflops * 1e12 * ms * 1e-3)
        nbytes.append(gbps * 1e9 * ms * 1e-3)
    f, b = _geomean(flops), _geomean(nbytes)
    if f is None or b is None:
        return None
    return {"flops": f, "bytes": b}


def roofline_points(
    kind: str, *, per_problem: int = ROOFLINE_PER_PROBLEM
) -> tuple[list[dict[str, Any]], int]:
    """Accepted, timed trials on `kind`, placed by the geometric-mean shape of their problem:
    intensity = geomean FLOPs / geomean bytes; achieved TFLOP/s = geomean FLOPs / geomean ms
    (the harness's geomean_ms is over the same shapes). One report per problem is read.

    The `per_problem` fastest trials of each problem (lowest geomean_ms, then oldest first),
    ranked by the database. Returns (points in trial order, how many candidates were left out).
    """
    base = Trial.objects.filter(device_kind=kind, status__in=ACCEPTED).exclude(geomean_ms=None)
    rank = Window(
        RowNumber(),
        partition_by=[F("search__idea__problem")],
        order_by=[F("geomean_ms").asc(), F("id").asc()],
    )
    fastest = base.annotate(rank=rank).filter(rank__lte=per_problem).values_list("id", flat=True)
    rows = list(
        Trial.objects.filter(pk__in=list(fastest))
        .order_by("id")
        .annotate(short=Substr("rationale", 1, LABEL_CHARS))
        .values("search_id", "index", "status", "geomean_ms", "search__idea__problem", "short")
    )
    left_out = base.count() - len(rows)
    work: dict[str, dict[str, float] | None] = {}
    for name in sorted({r["search__idea__problem"] for r in rows}):
        work[name] = None
        # The newest report with per-shape numbers (a tuner's quick report may have none),
        # one at a time and only its shapes: PostgreSQL would otherwise decompress every
        # candidate's report before sorting them.
        newest = (
            base.filter(search__idea__problem=name, report__isnull=False)
            .order_by("-id")
            .values_list("id", flat=True)[:REPORTS_SCANNED]
        )
        for pk in list(newest):
            shapes = Trial.objects.filter(pk=pk).values_list("report__shapes", flat=True).first()
            work[name] = problem_work({"shapes": shapes})
            if work[name] is not None:
                break
    points = []
    for r in rows:
        w = work.get(r["search__idea__problem"])
        if not w or not r["geomean_ms"]:
            continue  # no report of its problem times each shape: it cannot be placed
        points.append(
            {
                "problem": r["search__idea__problem"],
                "intensity": w["flops"] / w["bytes"],
                "tflops": w["flops"] / (r["geomean_ms"] * 1e-3) / 1e12,
                "status": r["status"],
                "label": _label(r),
                "url": trial_url(r["search_id"], r["index"]),
            }
        )
    return points, left_out


# -- per-shape heatmaps ------------------------------------------------------------------------


def _shape_speedups(report: dict[str, Any] | None) -> dict[str, float]:
    out = {}
    for shape in _shapes(report):
        label, value = shape.get("label"), _positive(shape.get("speedup_eager"))
        if isinstance(label, str) and value is not None:
            out[plotly_text(label)] = value
    return out


def _shape_order(reports: list[dict[str, Any] | None]) -> list[str]:
    seen: dict[str, None] = {}
    for report in reports:
        for shape in _shapes(report):
            if isinstance(shape.get("label"), str):
                seen.setdefault(plotly_text(shape["label"]), None)
    return list(seen)


def _with_shapes(trials, limit: int) -> list[Trial]:
    """The fastest of `trials` (vs eager) whose reports time each shape, at most `limit`,
    scanning a bounded number of reports."""
    out = []
    for trial in (
        trials.exclude(speedup_eager=None)
        .order_by("-speedup_eager", "id")
        .only("search_id", "index", "report")[: limit + REPORTS_SCANNED]
    ):
        if _shape_speedups(trial.report):
            out.append(trial)
            if len(out) >= limit:
                break
    return out


def heatmap_by_kind(problem: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Shapes x GPU kinds: for each kind, the per-shape speedups of its best kept trial."""
    columns, reports = [], []
    kept = Trial.objects.filter(status=Trial.Status.KEPT, search__idea__problem=problem).exclude(
        device_kind__in=("", INTERPRET)
    )
    for kind in sorted(kept.order_by().values_list("device_kind", flat=True).distinct()):
        best = next(iter(_with_shapes(kept.filter(device_kind=kind), 1)), None)
        if best is None:
            continue
        reports.append(best.report)
        columns.append(
            {
                "name": kind,
                "url": trial_url(best.search_id, best.index),
                "speedups": _shape_speedups(best.report),
            }
        )
    return _shape_order(reports), columns


def heatmap_by_kernel(
    problem: str, kind: str, *, limit: int = HEATMAP_KERNELS
) -> tuple[list[str], list[dict[str, Any]]]:
    """Shapes x kernels on one kind: the `limit` fastest kept trials (by speedup vs eager)."""
    best = _with_shapes(
        Trial.objects.filter(
            status=Trial.Status.KEPT, search__idea__problem=problem, device_kind=kind
        ),
        limit,
    )
    columns = [
        {
            "name": f"#{t.search_id}/{t.index}",
            "url": trial_url(t.search_id, t.index),
            "speedups": _shape_speedups(t.report),
        }
        for t in best
    ]
    return _shape_order([t.report for t in best]), columns


def kinds_with_kept(problem: str) -> list[str]:
    return sorted(
        set(
            Trial.objects.filter(status=Trial.Status.KEPT, search__idea__problem=problem)
            .exclude(device_kind__in=("", INTERPRET))
            .exclude(speedup_eager=None)
            .order_by()
            .values_list("device_kind", flat=True)
            .distinct()
        )
    )


# -- cross-GPU ---------------------------------------------------------------------------------


def cross_gpu_kernels(
    problem: str | None = None, *, limit: int = CROSS_GPU_KERNELS
) -> list[dict[str, Any]]:
    """Sources (by sha256) accepted and timed on two or more GPU kinds, with the best run on
    each kind; the sources run on the most kinds first."""
    timed = (
        Trial.objects.filter(status__in=ACCEPTED)
        .exclude(speedup_eager=None)
        .exclude(device_kind__in=("", INTERPRET))
    )
    if problem is not None:
        timed = timed.filter(search__idea__problem=problem)
    shas = list(
        timed.values("source_sha256")
        .annotate(kinds=Count("device_kind", distinct=True), last=Max("id"))
        .filter(kinds__gte=2)
        .order_by("-kinds", "-last")
        .values_list("source_sha256", flat=True)[:limit]
    )
    runs = (
        timed.filter(source_sha256__in=shas)
        .order_by("source_sha256", "device_kind", "-speedup_eager", "id")
        .values(
            "source_sha256",
            "device_kind",
            "speedup_eager",
            "speedup_compiled",
            "search_id",
            "index",
            "search__idea__problem",
        )
    )
    kernels: dict[str, dict[str, Any]] = {}
    for r in runs:
        sha = r["source_sha256"]
        kernel = kernels.setdefault(
            sha,
            {"label": f"{r['search__idea__problem']} {sha[:8]}", "sha256": sha, "runs": []},
        )
        if any(run["kind"] == r["device_kind"] for run in kernel["runs"]):
            continue  # the best run on this kind came first
        kernel["runs"].append(
            {
                "kind": r["device_kind"],
                "speedup_eager": r["speedup_eager"],
                "speedup_compiled": r["speedup_compiled"],
                "url": trial_url(r["search_id"], r["index"]),
            }
        )
    return [kernels[sha] for sha in shas if sha in kernels]


def has_trials(kind: str | None = None) -> bool:
    trials = Trial.objects.all() if kind is None else Trial.objects.filter(device_kind=kind)
    return trials.exists()
