"""Plotly figures, built with plotly's `graph_objects` by pure functions: rows in, figure out.

plotly validates every trace and layout property as the figure is built (a misspelt or
misplaced property raises), and each builder hands back the figure's JSON form
(`Figure.to_plotly_json()`, without plotly's default template) for the page to embed. Nothing
here reads the database (`searches.chart_data` gathers the rows); the browser draws the figures
with the plotly.js in static/vendor, the very file the pinned `plotly` package bundles. Every
builder returns a figure even with no data: `empty(...)` carries the message the page shows
instead of a blank box (``layout.meta.empty``). Speedups are ratios (× of a baseline), drawn on
log axes, where 2× and 0.5× sit the same distance from 1×.

Scale: a figure holds at most about `MAX_POINTS` markers. `decimate` keeps every kept trial
(so the incumbent line is exact) and an evenly spaced, deterministic sample of the rest; the
figure says how many it shows (``layout.meta.decimated``, and a note on the chart).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from kernels.protocol import FAILURES

# No plotly theme: the default one ("plotly") is deep-copied into every figure built (most of
# the time a small figure takes) and would ride along in its JSON. The house look is `_figure`'s.
pio.templates.default = None

MAX_POINTS = 2000

VERDICT_COLOURS = {"kept": "#1a7f37", "reverted": "#8c959f", "failed": "#cf222e"}
VERDICTS = tuple(VERDICT_COLOURS)
_SYMBOLS = {"kept": "circle", "reverted": "circle-open", "failed": "x"}
_FAILURE_COLOURS = {
    "compile_error": "#e36209",
    "prohibited": "#8250df",
    "incorrect": "#cf222e",
    "crashed": "#6e2b2b",
    "timeout": "#bf8700",
    "unstable": "#0969da",
    "hack_suspected": "#d63384",
    "malformed": "#57606a",
}
# Outcomes in a fixed order: successes first, then the harness's failure categories (a category
# added to kernels.protocol.FAILURES without a colour here stops the import).
OUTCOME_COLOURS = {
    "kept": VERDICT_COLOURS["kept"],
    "reverted": VERDICT_COLOURS["reverted"],
    **{failure: _FAILURE_COLOURS[failure] for failure in FAILURES},
}
OUTCOMES = tuple(OUTCOME_COLOURS)
KIND_COLOURS = ("#2f5bd3", "#e36209", "#1a7f37", "#8250df", "#cf222e", "#0a7c86", "#bf8700")
BASELINES = {"eager": "eager PyTorch", "compiled": "torch.compile"}
UNTIMED = "untimed"

SPEEDUP_TITLE = "speedup (×, log scale)"
SPEEDUP_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}
_GRID = "#eef0f3"
_MUTED = "#5b6575"


# -- shared pieces ----------------------------------------------------------------------------


def _figure(
    title: str,
    traces: Sequence[go.Scatter | go.Scattergl | go.Bar | go.Heatmap] = (),
    *,
    notes: Sequence[go.layout.Annotation] = (),
    parity: str | None = None,
    meta: dict[str, Any] | None = None,
    **layout: Any,
) -> dict[str, Any]:
    """The figure's JSON: the house layout (title top left, notes under it, white), `layout` on
    top, and a dashed 1× line on the y axis named by `parity` (above it the candidate is faster
    than the baseline)."""
    figure = go.Figure(
        data=list(traces),
        layout=go.Layout(
            title={
                "text": title,
                "x": 0,
                "xanchor": "left",
                "y": 0.98,
                "yanchor": "top",
                "font": {"size": 14},
            },
            font=_FONT,
            margin={"l": 60, "r": 20, "t": 70, "b": 50},
            hovermode="closest",
            legend={"font": {"size": 11}},
            paper_bgcolor="#ffffff",
            plot_bgcolor="#ffffff",
            annotations=list(notes),
            meta={"empty": False, **(meta or {})},
        ),
    )
    figure.update_layout(**layout)
    if parity:
        figure.add_shape(
            type="line",
            xref="paper",
            x0=0,
            x1=1,
            yref=parity,
            y0=1,
            y1=1,
            line={"color": _MUTED, "width": 1, "dash": "dash"},
        )
    return figure.to_plotly_json()


def empty(title: str, message: str) -> dict[str, Any]:
    """A figure with no data that says why: pages show `message` instead of an empty box."""
    return _figure(
        title,
        notes=[_note(message, y=0.5, x=0.5, xanchor="center", size=14)],
        meta={"empty": True, "message": message},
        xaxis_visible=False,
        yaxis_visible=False,
    )


def is_empty(figure: dict[str, Any]) -> bool:
    return bool(figure.get("layout", {}).get("meta", {}).get("empty"))


def _note(
    text: str, *, x: float = 0, y: float = 1.01, xanchor: str = "left", size: int = 11
) -> go.layout.Annotation:
    return go.layout.Annotation(
        text=text,
        xref="paper",
        yref="paper",
        x=x,
        y=y,
        xanchor=xanchor,
        yanchor="bottom" if y > 1 else "middle",
        showarrow=False,
        font={"size": size, "color": _MUTED},
    )


def _speedup_axis(title: str = SPEEDUP_TITLE, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "type": "log",
        "ticksuffix": "×",
        "tickvals": list(SPEEDUP_TICKS),
        "gridcolor": _GRID,
        "zeroline": False,
        **extra,
    }


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _links(rows: Iterable[dict[str, Any]]) -> list[list[str]]:
    """Per point [url, label]: a click opens the url (static/js/charts.js), hovers show label."""
    return [[row.get("url") or "", row.get("label") or ""] for row in rows]


def kind_colour(kind: str, kinds: Sequence[str]) -> str:
    ordered = sorted(set(kinds))
    index = ordered.index(kind) if kind in ordered else len(ordered)
    return KIND_COLOURS[index % len(KIND_COLOURS)]


def decimate(
    rows: Sequence[dict[str, Any]],
    limit: int = MAX_POINTS,
    keep: Callable[[dict[str, Any]], bool] = lambda row: row.get("status") == "kept",
) -> tuple[list[dict[str, Any]], int]:
    """At most about `limit` rows, in their order: every row `keep` says to keep, and an evenly
    spaced sample of the others (the same rows on every call). Returns (rows, how many dropped).

    Kept rows are never dropped, so with more than `limit` of them all are kept anyway.
    """
    if len(rows) <= limit:
        return list(rows), 0
    must = [i for i, row in enumerate(rows) if keep(row)]
    others = [i for i, row in enumerate(rows) if not keep(row)]
    room = max(limit - len(must), 0)
    if room >= len(others):
        chosen = others
    elif room == 0:
        chosen = []
    elif room == 1:
        chosen = [others[-1]]
    else:
        # Evenly spaced, first and last included: the sample spans the whole search.
        step = (len(others) - 1) / (room - 1)
        chosen = sorted({others[round(i * step)] for i in range(room)})
    picked = sorted(set(must) | set(chosen))
    return [rows[i] for i in picked], len(rows) - len(picked)


def _decimation_note(shown: int, dropped: int, what: str = "trials") -> str:
    total = shown + dropped
    return (
        f"showing {shown:,} of {total:,} {what}: every kept one, "
        f"the rest sampled evenly (deterministic)"
    )


# -- speedup per problem, per GPU kind ---------------------------------------------------------

_BAR_STYLES = {
    ("found", "eager"): ("#2f5bd3", ""),
    ("found", "compiled"): ("#9db4ef", ""),
    ("released", "eager"): ("#1a7f37", "/"),
    ("released", "compiled"): ("#8fd19e", "/"),
}


def speedup_by_problem(
    kind: str, found: Sequence[dict[str, Any]], released: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Best found and best released speedup per problem on one GPU kind, vs eager and vs
    torch.compile, as grouped bars on a log axis.

    Rows: ``{"problem", "speedup_eager", "speedup_compiled", "label", "url"}``; `found` from
    kept trials, `released` from the library (empty until something is released).
    """
    title = f"{kind}: best speedup per problem"
    problems = sorted({r["problem"] for r in [*found, *released] if _any_speedup(r)})
    if not problems:
        return empty(title, f"No timed kept trial and no release on {kind} yet.")
    traces = []
    for series, rows in (("found", found), ("released", released)):
        by_problem = {r["problem"]: r for r in rows}
        for baseline, label in BASELINES.items():
            colour, pattern = _BAR_STYLES[(series, baseline)]
            bars = [
                (problem, value, by_problem[problem])
                for problem in problems
                if problem in by_problem
                and (value := _positive(by_problem[problem].get(f"speedup_{baseline}")))
            ]
            if not bars:
                continue
            traces.append(
                go.Bar(
                    name=f"best {series} vs {label}",
                    x=[problem for problem, _, _ in bars],
                    y=[value for _, value, _ in bars],
                    customdata=_links(row for _, _, row in bars),
                    marker={"color": colour, "pattern": {"shape": pattern}},
                    hovertemplate=(
                        f"%{{x}}: %{{y:.2f}}× vs {label}<br>%{{customdata[1]}}"
                        f"<extra>best {series}</extra>"
                    ),
                )
            )
    notes = [] if released else [_note(f"No releases on {kind} yet: only the best found is shown.")]
    return _figure(
        title,
        traces,
        notes=notes,
        parity="y",
        meta={"releases": len(released)},
        barmode="group",
        xaxis={"title": {"text": "problem"}, "type": "category"},
        yaxis=_speedup_axis(),
    )


def _any_speedup(row: dict[str, Any]) -> bool:
    return any(_positive(row.get(f"speedup_{b}")) for b in BASELINES)


# -- per-shape heatmap -------------------------------------------------------------------------


def shape_heatmap(
    title: str,
    shapes: Sequence[str],
    columns: Sequence[dict[str, Any]],
    *,
    column_title: str,
) -> dict[str, Any]:
    """Speedup vs eager per shape (rows) and column (GPU kinds, or kernels).

    Columns: ``{"name", "url", "speedups": {shape label: speedup}}``. The colour is log2 of the
    speedup, centred on 1× (white); cells a column did not time stay blank.
    """
    values = [[_positive(column["speedups"].get(shape)) for column in columns] for shape in shapes]
    if not any(v for row in values for v in row):
        return empty(title, "No per-shape timing recorded yet.")
    z = [[None if v is None else round(math.log2(v), 4) for v in row] for row in values]
    bound = max(1.0, math.ceil(max(abs(v) for row in z for v in row if v is not None)))
    ticks = list(range(-int(bound), int(bound) + 1))
    heatmap = go.Heatmap(
        x=[c["name"] for c in columns],
        y=list(shapes),
        z=z,
        text=[["" if v is None else f"{v:.2f}×" for v in row] for row in values],
        texttemplate="%{text}",
        customdata=[_links({"url": c.get("url"), "label": c["name"]} for c in columns)] * len(z),
        zmin=-bound,
        zmax=bound,
        zmid=0,
        # Slower red, 1× white, faster green (the verdict colours).
        colorscale=[[0, "#b2182b"], [0.5, "#f7f7f7"], [1, "#1a7f37"]],
        colorbar={
            "title": {"text": "vs eager"},
            "tickvals": ticks,
            "ticktext": [f"{2.0**v:g}×" for v in ticks],
        },
        hovertemplate="%{y} on %{x}: %{text} vs eager<extra></extra>",
        xgap=2,
        ygap=2,
    )
    return _figure(
        title,
        [heatmap],
        xaxis={"title": {"text": column_title}, "type": "category"},
        yaxis={"title": {"text": "shape"}, "type": "category", "autorange": "reversed"},
        height=max(300, 60 + 26 * len(shapes)),
        margin={"l": 140, "r": 20, "t": 70, "b": 60},
    )


# -- one search: progress and budget -----------------------------------------------------------


def search_progress(trials: Sequence[dict[str, Any]], *, limit: int = MAX_POINTS) -> dict[str, Any]:
    """Every judged trial as a point coloured by its verdict; the incumbent as a step line.

    Rows, in trial order: ``{"index", "status", "failure", "speedup_eager", "label", "url"}``.
    Timed trials sit on a log axis of speedup vs eager; failed and untimed ones (no speedup) in a
    strip below, by failure category. Trials not yet judged are not drawn.
    """
    title = "Progress: speedup vs eager per trial"
    judged = [t for t in trials if t.get("status") in VERDICTS]
    if not judged:
        return empty(title, "No trial has been judged yet. Points appear as trials finish.")

    # The incumbent from every kept trial, before any decimation: the line is exact.
    steps = [t for t in judged if t["status"] == "kept" and _positive(t.get("speedup_eager"))]
    last = judged[-1]["index"]
    traces: list[Any] = []
    if steps:
        xs, ys = [t["index"] for t in steps], [float(t["speedup_eager"]) for t in steps]
        if xs[-1] != last:  # held until the last judged trial
            steps, xs, ys = [*steps, steps[-1]], [*xs, last], [*ys, ys[-1]]
        traces.append(
            go.Scatter(
                mode="lines",
                name="incumbent",
                x=xs,
                y=ys,
                customdata=_links(steps),
                line={"shape": "hv", "color": VERDICT_COLOURS["kept"], "width": 2},
                hovertemplate="incumbent after trial %{x}: %{y:.2f}×<extra></extra>",
                yaxis="y",
            )
        )

    shown, dropped = decimate(judged, limit)
    for status in ("kept", "reverted"):
        rows = [t for t in shown if t["status"] == status and _positive(t.get("speedup_eager"))]
        if rows:
            traces.append(_trial_points(rows, status, "y"))
    strip = [t for t in shown if not _positive(t.get("speedup_eager"))]
    categories: set[str] = set()
    for status in ("failed", "kept", "reverted"):
        rows = [t for t in strip if t["status"] == status]
        if rows:
            traces.append(_trial_points(rows, status, "y2", strip=True))
            categories.update(_category(t) for t in rows)
    notes = [_note(_decimation_note(len(shown), dropped))] if dropped else []
    return _figure(
        title,
        traces,
        notes=notes,
        parity="y",
        meta={"trials": len(judged), "shown": len(shown), "decimated": dropped, "last_index": last},
        # Drawn under the strip, so the ticks do not cross the failed trials.
        xaxis={"title": {"text": "trial"}, "gridcolor": _GRID, "zeroline": False, "anchor": "y2"},
        yaxis=_speedup_axis("speedup vs eager (×, log)", domain=[0.3, 1]),
        yaxis2={
            "domain": [0, 0.22],
            "type": "category",
            "categoryorder": "array",
            "categoryarray": [c for c in (*OUTCOMES, UNTIMED) if c in categories],
            "title": {"text": "no speedup"},
            "anchor": "x",
        },
        height=420,
    )


def _trial_points(
    rows: list[dict[str, Any]], status: str, axis: str, *, strip: bool = False
) -> go.Scatter | go.Scattergl:
    value = "%{y}" if strip else "%{y:.2f}× vs eager"
    return (go.Scattergl if len(rows) > 1000 else go.Scatter)(
        mode="markers",
        name=status if not strip or status == "failed" else f"{status} (untimed)",
        x=[t["index"] for t in rows],
        y=[_category(t) for t in rows] if strip else [t["speedup_eager"] for t in rows],
        customdata=_links(rows),
        marker={"color": VERDICT_COLOURS[status], "symbol": _SYMBOLS[status], "size": 7},
        hovertemplate=f"trial %{{x}} {status}: {value}<br>%{{customdata[1]}}<extra></extra>",
        yaxis=axis,
    )


def _category(trial: dict[str, Any]) -> str:
    return trial.get("failure") or UNTIMED


def budget_burndown(
    budget: dict[str, dict[str, Any]],
    events: Sequence[dict[str, Any]],
    *,
    limit: int = MAX_POINTS,
) -> dict[str, Any]:
    """Budget left over the search's wall time, in % of each budget.

    `budget` is `Search.budget()`; events, in time order, are the judged trials:
    ``{"minute": wall minutes since the start, "gpu_seconds", "tokens"}``. The wall-time budget
    runs down as a straight line; trials, GPU minutes and tokens step down as trials finish.
    """
    title = "Budget left"
    if not events:
        return empty(title, "Nothing spent yet: the burn-down starts with the first judged trial.")
    sampled, dropped = decimate(events, limit, keep=lambda e: False)
    drawn = {id(e) for e in sampled}
    allowed = {"trials": budget["trials"]["max"], "GPU minutes": budget["gpu_minutes"]["max"]}
    if budget.get("tokens", {}).get("max"):
        allowed["tokens"] = budget["tokens"]["max"]
    series = {name: ([0.0], [100.0]) for name in allowed}
    used = dict.fromkeys(allowed, 0.0)
    for n, event in enumerate(events, start=1):
        used["trials"] = n
        used["GPU minutes"] += float(event.get("gpu_seconds") or 0) / 60
        used["tokens"] = used.get("tokens", 0.0) + float(event.get("tokens") or 0)
        if id(event) not in drawn and n != len(events):
            continue
        for name, (xs, ys) in series.items():
            cap = float(allowed[name] or 0)
            xs.append(round(float(event["minute"]), 3))
            ys.append(round(0.0 if cap <= 0 else max(0.0, 100.0 * (1 - used[name] / cap)), 2))
    wall_max = float(budget["wall_minutes"]["max"])
    end = max(float(budget["wall_minutes"]["used"] or 0), series["trials"][0][-1])
    traces = [
        go.Scatter(
            mode="lines",
            name=name,
            x=xs,
            y=ys,
            line={"shape": "hv", "width": 2},
            hovertemplate=f"%{{x:.1f}} min: %{{y:.1f}}% of {name} left<extra></extra>",
        )
        for name, (xs, ys) in series.items()
    ]
    traces.append(
        go.Scatter(
            mode="lines",
            name="wall time",
            x=[0, end],
            y=[100.0, round(max(0.0, 100 * (1 - end / wall_max)), 2)],
            line={"dash": "dot", "color": _MUTED},
            hovertemplate="%{x:.1f} min: %{y:.1f}% of wall time left<extra></extra>",
        )
    )
    return _figure(
        title,
        traces,
        notes=[_note(_decimation_note(len(sampled), dropped))] if dropped else [],
        xaxis={"title": {"text": "wall minutes since start"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "left (% of budget)"}, "range": [0, 105], "ticksuffix": "%"},
        height=320,
    )


# -- roofline ----------------------------------------------------------------------------------


def roofline(
    kind: str,
    ceilings: dict[str, Any] | None,
    points: Sequence[dict[str, Any]],
    *,
    left_out: int = 0,
    per_problem: int | None = None,
    limit: int = MAX_POINTS,
) -> dict[str, Any]:
    """Accepted candidates on the measured roofline of one GPU kind (log-log).

    Ceilings: ``{"copy_gbps", "matmul_tflops_bf16"}`` as measured by the workers. Points:
    ``{"problem", "intensity" (FLOP/byte), "tflops" (achieved), "status", "label", "url"}``.
    `left_out`: candidates the caller did not pass because they were not among the
    `per_problem` fastest of their problem; the chart says how many.
    """
    title = f"{kind}: roofline"
    bw = _positive((ceilings or {}).get("copy_gbps"))
    peak = _positive((ceilings or {}).get("matmul_tflops_bf16"))
    usable = [p for p in points if _positive(p.get("intensity")) and _positive(p.get("tflops"))]
    if not usable and not (bw and peak):
        return empty(title, f"No measured ceilings and no timed accepted candidate on {kind} yet.")
    shown, dropped = decimate(usable, limit)
    traces: list[go.Scatter] = []
    notes = []
    xs = [p["intensity"] for p in shown]
    if bw and peak:
        ridge = peak * 1e3 / bw  # FLOP/byte where the two roofs meet
        lo = min([ridge / 100, *xs]) / 2
        hi = max([ridge * 10, *xs]) * 2
        traces.append(
            go.Scatter(
                mode="lines",
                name="measured roof",
                x=[lo, ridge, hi],
                y=[lo * bw / 1e3, peak, peak],
                line={"color": "#1c2330", "width": 2},
                hovertemplate="roof at %{x:.3g} FLOP/byte: %{y:.4g} TFLOP/s<extra></extra>",
            )
        )
        notes.append(_note(f"roof: copy {bw:,.0f} GB/s, bf16 matmul {peak:,.0f} TFLOP/s"))
    else:
        notes.append(_note(f"Ceilings not measured on {kind}: no roof drawn."))
    problems = sorted({p["problem"] for p in shown})
    for problem in problems:
        rows = [p for p in shown if p["problem"] == problem]
        traces.append(
            go.Scatter(
                mode="markers",
                name=problem,
                x=[p["intensity"] for p in rows],
                y=[p["tflops"] for p in rows],
                customdata=_links(rows),
                marker={
                    "size": 8,
                    "color": kind_colour(problem, problems),
                    "symbol": [
                        _SYMBOLS["kept" if p.get("status") == "kept" else "reverted"] for p in rows
                    ],
                },
                hovertemplate=(
                    "%{customdata[1]}<br>%{x:.3g} FLOP/byte, %{y:.4g} TFLOP/s"
                    "<br>click to open the trial<extra>" + problem + "</extra>"
                ),
            )
        )
    if not usable:
        notes.append(
            _note(
                f"No timed accepted candidate on {kind} yet.",
                y=0.5,
                x=0.5,
                xanchor="center",
                size=13,
            )
        )
    if left_out:
        notes.append(
            _note(
                f"showing {len(shown):,} of {len(usable) + left_out:,} candidates: the "
                f"{per_problem:,} fastest of each problem",
                y=1.06,
            )
        )
    elif dropped:
        notes.append(_note(_decimation_note(len(shown), dropped, "candidates"), y=1.06))
    return _figure(
        title,
        traces,
        notes=notes,
        meta={
            "points": len(usable) + left_out,
            "shown": len(shown),
            "decimated": dropped + left_out,
        },
        xaxis={
            "title": {"text": "arithmetic intensity (FLOP/byte, log)"},
            "type": "log",
            "dtick": 1,
        },
        yaxis={"title": {"text": "achieved TFLOP/s (log)"}, "type": "log", "dtick": 1},
        height=420,
    )


# -- failure taxonomy --------------------------------------------------------------------------


def failure_shares(counts: Sequence[dict[str, Any]], *, title: str | None = None) -> dict[str, Any]:
    """Share of judged trials by outcome (kept, reverted, each failure category), one bar per
    proposer / model. Rows: ``{"group", "outcome", "count"}``."""
    return _share_bars(
        title or "Outcome of trials per proposer / model",
        counts,
        axis_title="proposer / model",
        horizontal=True,
    )


def failures_over_time(
    counts: Sequence[dict[str, Any]], *, bucket: str, title: str | None = None
) -> dict[str, Any]:
    """Share of judged trials by outcome per time bucket (``"group"`` is the bucket's start)."""
    return _share_bars(
        title or f"Outcome of trials per {bucket}", counts, axis_title=f"{bucket} (UTC)"
    )


def _share_bars(
    title: str,
    counts: Sequence[dict[str, Any]],
    *,
    axis_title: str,
    horizontal: bool = False,
) -> dict[str, Any]:
    groups = sorted({r["group"] for r in counts if r["count"]})
    if not groups:
        return empty(title, "No judged trial yet: the failure picture fills in as trials finish.")
    totals = {g: sum(r["count"] for r in counts if r["group"] == g) for g in groups}
    index = {(r["group"], r["outcome"]): r["count"] for r in counts}
    share, group = ("x", "y") if horizontal else ("y", "x")
    traces = []
    for outcome in OUTCOMES:
        numbers = [[index.get((g, outcome), 0), totals[g]] for g in groups]
        if not any(n for n, _ in numbers):
            continue
        shares = [round(100 * n / total, 2) if total else 0 for n, total in numbers]
        label = outcome.replace("_", " ")
        traces.append(
            go.Bar(
                name=label,
                marker={"color": OUTCOME_COLOURS[outcome]},
                customdata=numbers,
                hovertemplate=(
                    f"{label}: %{{customdata[0]}} of %{{customdata[1]}} trials"
                    f" (%{{{share}:.1f}}%)<extra>%{{{group}}}</extra>"
                ),
                **({share: shares, group: groups}),
                **({"orientation": "h"} if horizontal else {}),
            )
        )
    share_axis = {"title": {"text": "share of judged trials"}, "range": [0, 100], "ticksuffix": "%"}
    group_axis = {"title": {"text": axis_title}, "type": "category", "automargin": True}
    failed = sum(r["count"] for r in counts if r["outcome"] not in ("kept", "reverted"))
    total = sum(totals.values())
    return _figure(
        title,
        traces,
        notes=[
            _note(f"{failed:,} of {total:,} judged trials failed ({100 * failed / total:.0f}%)")
        ],
        meta={"judged": total, "failed": failed},
        barmode="stack",
        xaxis=share_axis if horizontal else group_axis,
        yaxis=group_axis if horizontal else share_axis,
        height=max(300, 140 + 34 * len(groups)) if horizontal else 340,
    )


# -- the same kernel on several GPU kinds ------------------------------------------------------


def cross_gpu(kernels: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The same source (by sha256) measured on each GPU kind it ran on.

    Kernels: ``{"label", "runs": [{"kind", "speedup_eager", "speedup_compiled", "url"}]}``.
    """
    title = "Same kernel, each GPU kind: speedup vs eager"
    usable = [k for k in kernels if len({r["kind"] for r in k["runs"]}) >= 2]
    if not usable:
        return empty(title, "No kernel has been timed on more than one GPU kind yet.")
    kinds = sorted({r["kind"] for k in usable for r in k["runs"]})
    traces = []
    for kind in kinds:
        bars = []
        for k in usable:
            run = next((r for r in k["runs"] if r["kind"] == kind), None)
            value = _positive(run.get("speedup_eager")) if run else None
            if value is not None:
                compiled = _positive(run.get("speedup_compiled"))
                bars.append((k["label"], value, run.get("url") or "", compiled))
        traces.append(
            go.Bar(
                name=kind,
                x=[label for label, _, _, _ in bars],
                y=[value for _, value, _, _ in bars],
                customdata=[[url, f"{c:.2f}×" if c else "—"] for _, _, url, c in bars],
                marker={"color": kind_colour(kind, kinds)},
                hovertemplate=(
                    "%{x} on " + kind + ": %{y:.2f}× vs eager, %{customdata[1]} vs torch.compile"
                    "<extra></extra>"
                ),
            )
        )
    return _figure(
        title,
        traces,
        parity="y",
        barmode="group",
        xaxis={"title": {"text": "kernel"}, "type": "category", "automargin": True},
        yaxis=_speedup_axis(),
    )


def trace_names(figure: dict[str, Any]) -> list[str]:
    return [t.get("name", "") for t in figure.get("data", [])]


def points(figure: dict[str, Any], name: str) -> Iterable[tuple[Any, Any]]:
    """(x, y) pairs of the trace called `name` (tests and debugging)."""
    for trace in figure.get("data", []):
        if trace.get("name") == name:
            return list(zip(trace.get("x", []), trace.get("y", []), strict=False))
    return []
