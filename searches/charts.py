"""Plotly figures, built as plain JSON (dicts) by pure functions: rows in, figure out.

Nothing here reads the database (`searches.chart_data` gathers the rows) or imports plotly: the
browser draws the figures with the plotly.js in static/vendor. Every builder returns a figure
even with no data: `empty(...)` carries the message the page shows instead of a blank box
(``layout.meta.empty``). Speedups are ratios (× of a baseline), drawn on log axes, where 2× and
0.5× sit the same distance from 1×.

Scale: a figure holds at most about `MAX_POINTS` markers. `decimate` keeps every kept trial
(so the incumbent line is exact) and an evenly spaced, deterministic sample of the rest; the
figure says how many it shows (``layout.meta.decimated``, and a note on the chart).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

MAX_POINTS = 2000

VERDICT_COLOURS = {"kept": "#1a7f37", "reverted": "#8c959f", "failed": "#cf222e"}
# Outcomes in a fixed order: successes first, then the harness's failure categories.
OUTCOME_COLOURS = {
    "kept": "#1a7f37",
    "reverted": "#8c959f",
    "compile_error": "#e36209",
    "prohibited": "#8250df",
    "incorrect": "#cf222e",
    "crashed": "#6e2b2b",
    "timeout": "#bf8700",
    "unstable": "#0969da",
    "hack_suspected": "#d63384",
    "malformed": "#57606a",
}
OUTCOMES = tuple(OUTCOME_COLOURS)
KIND_COLOURS = ("#2f5bd3", "#e36209", "#1a7f37", "#8250df", "#cf222e", "#0a7c86", "#bf8700")
BASELINES = {"eager": "eager PyTorch", "compiled": "torch.compile"}
UNTIMED = "untimed"

SPEEDUP_TITLE = "speedup (×, log scale)"
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


# -- shared pieces ----------------------------------------------------------------------------


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        # The title at the top of the box; notes (`_note`) sit between it and the plot.
        "title": {
            "text": title,
            "x": 0,
            "xanchor": "left",
            "y": 0.98,
            "yanchor": "top",
            "font": {"size": 14},
        },
        "font": _FONT,
        "margin": {"l": 60, "r": 20, "t": 70, "b": 50},
        "hovermode": "closest",
        "legend": {"font": {"size": 11}},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "meta": {"empty": False},
    }
    layout.update(extra)
    return layout


def empty(title: str, message: str) -> dict[str, Any]:
    """A figure with no data that says why: pages show `message` instead of an empty box."""
    layout = _layout(
        title,
        xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[_note(message, y=0.5, x=0.5, xanchor="center", size=14)],
    )
    layout["meta"] = {"empty": True, "message": message}
    return {"data": [], "layout": layout}


def is_empty(figure: dict[str, Any]) -> bool:
    return bool(figure.get("layout", {}).get("meta", {}).get("empty"))


def _note(
    text: str, *, x: float = 0, y: float = 1.01, xanchor: str = "left", size: int = 11
) -> dict[str, Any]:
    return {
        "text": text,
        "xref": "paper",
        "yref": "paper",
        "x": x,
        "y": y,
        "xanchor": xanchor,
        "yanchor": "bottom" if y > 1 else "middle",
        "showarrow": False,
        "font": {"size": size, "color": "#5b6575"},
    }


SPEEDUP_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def _speedup_axis(title: str = SPEEDUP_TITLE, **extra: Any) -> dict[str, Any]:
    axis = {
        "title": {"text": title},
        "type": "log",
        "ticksuffix": "×",
        "tickvals": list(SPEEDUP_TICKS),
        "gridcolor": "#eef0f3",
        "zeroline": False,
    }
    axis.update(extra)
    return axis


def _parity_line(axis: str = "y") -> dict[str, Any]:
    """A dashed line at 1×: above it the candidate is faster than the baseline."""
    return {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": axis,
        "y0": 1,
        "y1": 1,
        "line": {"color": "#5b6575", "width": 1, "dash": "dash"},
    }


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


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


def speedup_by_problem(
    kind: str, found: Sequence[dict[str, Any]], released: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Best found and best released speedup per problem on one GPU kind, vs eager and vs
    torch.compile, as grouped bars on a log axis.

    Rows: ``{"problem", "speedup_eager", "speedup_compiled", "label", "url"}``; `found` from
    kept trials, `released` from the library (empty until something is released).
    """
    title = f"{kind}: best speedup per problem"
    problems = sorted(
        {r["problem"] for r in [*found, *released] if _any_speedup(r)},
    )
    if not problems:
        return empty(title, f"No timed kept trial and no release on {kind} yet.")
    traces = []
    styles = {
        ("found", "eager"): ("#2f5bd3", ""),
        ("found", "compiled"): ("#9db4ef", ""),
        ("released", "eager"): ("#1a7f37", "/"),
        ("released", "compiled"): ("#8fd19e", "/"),
    }
    for series, rows in (("found", found), ("released", released)):
        by_problem = {r["problem"]: r for r in rows}
        for baseline, label in BASELINES.items():
            colour, pattern = styles[(series, baseline)]
            xs, ys, custom = [], [], []
            for problem in problems:
                row = by_problem.get(problem)
                value = _positive(row.get(f"speedup_{baseline}")) if row else None
                if value is None:
                    continue
                xs.append(problem)
                ys.append(value)
                custom.append([row.get("url") or "", row.get("label") or ""])
            if not xs:
                continue
            traces.append(
                {
                    "type": "bar",
                    "name": f"best {series} vs {label}",
                    "x": xs,
                    "y": ys,
                    "customdata": custom,
                    "marker": {"color": colour, "pattern": {"shape": pattern}},
                    "hovertemplate": (
                        f"%{{x}}: %{{y:.2f}}× vs {label}<br>%{{customdata[1]}}"
                        f"<extra>best {series}</extra>"
                    ),
                }
            )
    annotations = []
    if not released:
        annotations.append(_note(f"No releases on {kind} yet: only the best found is shown."))
    layout = _layout(
        title,
        barmode="group",
        xaxis={"title": {"text": "problem"}, "type": "category"},
        yaxis=_speedup_axis(),
        shapes=[_parity_line()],
        annotations=annotations,
    )
    layout["meta"]["releases"] = len(released)
    return {"data": traces, "layout": layout}


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
    cells = [
        (shape, column)
        for column in columns
        for shape in shapes
        if _positive(column["speedups"].get(shape))
    ]
    if not shapes or not cells:
        return empty(title, "No per-shape timing recorded yet.")
    names = [c["name"] for c in columns]
    z, text, custom = [], [], []
    for shape in shapes:
        z_row, text_row, custom_row = [], [], []
        for column in columns:
            value = _positive(column["speedups"].get(shape))
            z_row.append(None if value is None else round(math.log2(value), 4))
            text_row.append("" if value is None else f"{value:.2f}×")
            custom_row.append([column.get("url") or "", column["name"]])
        z.append(z_row)
        text.append(text_row)
        custom.append(custom_row)
    finite = [abs(v) for row in z for v in row if v is not None]
    bound = max(1.0, math.ceil(max(finite)))
    ticks = [v for v in range(-int(bound), int(bound) + 1)]
    trace = {
        "type": "heatmap",
        "x": names,
        "y": list(shapes),
        "z": z,
        "text": text,
        "texttemplate": "%{text}",
        "customdata": custom,
        "zmin": -bound,
        "zmax": bound,
        "zmid": 0,
        # Slower red, 1× white, faster green (the verdict colours).
        "colorscale": [[0, "#b2182b"], [0.5, "#f7f7f7"], [1, "#1a7f37"]],
        "colorbar": {
            "title": {"text": "vs eager"},
            "tickvals": ticks,
            "ticktext": [f"{2.0**v:g}×" for v in ticks],
        },
        "hovertemplate": "%{y} on %{x}: %{text} vs eager<extra></extra>",
        "xgap": 2,
        "ygap": 2,
    }
    layout = _layout(
        title,
        xaxis={"title": {"text": column_title}, "type": "category"},
        yaxis={"title": {"text": "shape"}, "type": "category", "autorange": "reversed"},
        height=max(300, 60 + 26 * len(shapes)),
        margin={"l": 140, "r": 20, "t": 70, "b": 60},
    )
    return {"data": [trace], "layout": layout}


# -- one search: progress and budget -----------------------------------------------------------


def search_progress(trials: Sequence[dict[str, Any]], *, limit: int = MAX_POINTS) -> dict[str, Any]:
    """Every judged trial as a point coloured by its verdict; the incumbent as a step line.

    Rows, in trial order: ``{"index", "status", "failure", "speedup_eager", "label", "url"}``.
    Timed trials sit on a log axis of speedup vs eager; failed and untimed ones (no speedup) in a
    strip below, by failure category. Trials not yet judged are not drawn.
    """
    title = "Progress: speedup vs eager per trial"
    judged = [t for t in trials if t.get("status") in VERDICT_COLOURS]
    if not judged:
        return empty(title, "No trial has been judged yet. Points appear as trials finish.")

    # The incumbent from every kept trial, before any decimation: the line is exact.
    steps_x, steps_y, steps_c = [], [], []
    for t in judged:
        value = _positive(t.get("speedup_eager"))
        if t["status"] == "kept" and value is not None:
            steps_x.append(t["index"])
            steps_y.append(value)
            steps_c.append([t.get("url") or "", t.get("label") or ""])
    last = judged[-1]["index"]
    if steps_x and steps_x[-1] != last:
        steps_x.append(last)
        steps_y.append(steps_y[-1])
        steps_c.append(steps_c[-1])

    shown, dropped = decimate(judged, limit)
    traces: list[dict[str, Any]] = []
    for status in ("kept", "reverted"):
        rows = [t for t in shown if t["status"] == status and _positive(t.get("speedup_eager"))]
        if rows:
            traces.append(_trial_points(rows, status, "y"))
    strip = [t for t in shown if not _positive(t.get("speedup_eager"))]
    categories: list[str] = []
    for status in ("failed", "kept", "reverted"):
        rows = [t for t in strip if t["status"] == status]
        if not rows:
            continue
        traces.append(_trial_points(rows, status, "y2", strip=True))
        categories.extend(_category(t) for t in rows)
    if steps_x:
        traces.insert(
            0,
            {
                "type": "scatter",
                "mode": "lines",
                "name": "incumbent",
                "x": steps_x,
                "y": steps_y,
                "customdata": steps_c,
                "line": {"shape": "hv", "color": "#1a7f37", "width": 2},
                "hovertemplate": "incumbent after trial %{x}: %{y:.2f}×<extra></extra>",
                "yaxis": "y",
            },
        )
    order = [c for c in (*OUTCOMES, UNTIMED) if c in set(categories)]
    annotations = []
    if dropped:
        annotations.append(_note(_decimation_note(len(shown), dropped)))
    layout = _layout(
        title,
        # Drawn under the strip, so the ticks do not cross the failed trials.
        xaxis={
            "title": {"text": "trial"},
            "gridcolor": "#eef0f3",
            "zeroline": False,
            "anchor": "y2",
        },
        yaxis=_speedup_axis("speedup vs eager (×, log)", domain=[0.3, 1]),
        yaxis2={
            "domain": [0, 0.22],
            "type": "category",
            "categoryorder": "array",
            "categoryarray": order,
            "title": {"text": "no speedup"},
            "anchor": "x",
        },
        shapes=[_parity_line("y")],
        annotations=annotations,
        height=420,
    )
    layout["meta"].update(
        {"trials": len(judged), "shown": len(shown), "decimated": dropped, "last_index": last}
    )
    return {"data": traces, "layout": layout}


def _trial_points(
    rows: list[dict[str, Any]], status: str, axis: str, *, strip: bool = False
) -> dict[str, Any]:
    symbol = {"kept": "circle", "reverted": "circle-open", "failed": "x"}[status]
    name = status if not strip or status == "failed" else f"{status} (untimed)"
    ys = [_category(t) for t in rows] if strip else [t["speedup_eager"] for t in rows]
    value = "%{y}" if strip else "%{y:.2f}× vs eager"
    return {
        "type": "scattergl" if len(rows) > 1000 else "scatter",
        "mode": "markers",
        "name": name,
        "x": [t["index"] for t in rows],
        "y": ys,
        "customdata": [[t.get("url") or "", t.get("label") or ""] for t in rows],
        "marker": {"color": VERDICT_COLOURS[status], "symbol": symbol, "size": 7},
        "hovertemplate": f"trial %{{x}} {status}: {value}<br>%{{customdata[1]}}<extra></extra>",
        "yaxis": axis,
    }


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
    indices = {id(e) for e in sampled}
    series: dict[str, tuple[list[float], list[float]]] = {
        "trials": ([0.0], [100.0]),
        "GPU minutes": ([0.0], [100.0]),
    }
    max_tokens = budget.get("tokens", {}).get("max")
    if max_tokens:
        series["tokens"] = ([0.0], [100.0])
    used_trials = used_gpu = used_tokens = 0.0
    for n, event in enumerate(events, start=1):
        used_trials = n
        used_gpu += float(event.get("gpu_seconds") or 0) / 60
        used_tokens += float(event.get("tokens") or 0)
        if id(event) not in indices and n != len(events):
            continue
        minute = round(float(event["minute"]), 3)
        _left(series["trials"], minute, used_trials, budget["trials"]["max"])
        _left(series["GPU minutes"], minute, used_gpu, budget["gpu_minutes"]["max"])
        if max_tokens:
            _left(series["tokens"], minute, used_tokens, max_tokens)
    wall_max = float(budget["wall_minutes"]["max"])
    wall_used = float(budget["wall_minutes"]["used"] or 0)
    end = max(wall_used, series["trials"][0][-1])
    traces = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": name,
            "x": xs,
            "y": ys,
            "line": {"shape": "hv", "width": 2},
            "hovertemplate": f"%{{x:.1f}} min: %{{y:.1f}}% of {name} left<extra></extra>",
        }
        for name, (xs, ys) in series.items()
    ]
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "wall time",
            "x": [0, end],
            "y": [100.0, round(max(0.0, 100 * (1 - end / wall_max)), 2)],
            "line": {"dash": "dot", "color": "#5b6575"},
            "hovertemplate": "%{x:.1f} min: %{y:.1f}% of wall time left<extra></extra>",
        }
    )
    annotations = [_note(_decimation_note(len(sampled), dropped))] if dropped else []
    layout = _layout(
        title,
        xaxis={"title": {"text": "wall minutes since start"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "left (% of budget)"}, "range": [0, 105], "ticksuffix": "%"},
        annotations=annotations,
        height=320,
    )
    return {"data": traces, "layout": layout}


def _left(
    series: tuple[list[float], list[float]], minute: float, used: float, allowed: Any
) -> None:
    xs, ys = series
    allowed = float(allowed or 0)
    left = 0.0 if allowed <= 0 else max(0.0, 100.0 * (1 - used / allowed))
    xs.append(minute)
    ys.append(round(left, 2))


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
    traces: list[dict[str, Any]] = []
    annotations = []
    xs = [p["intensity"] for p in shown]
    if bw and peak:
        ridge = peak * 1e3 / bw  # FLOP/byte where the two roofs meet
        lo = min([ridge / 100, *xs]) / 2
        hi = max([ridge * 10, *xs]) * 2
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "measured roof",
                "x": [lo, ridge, hi],
                "y": [lo * bw / 1e3, peak, peak],
                "line": {"color": "#1c2330", "width": 2},
                "hovertemplate": "roof at %{x:.3g} FLOP/byte: %{y:.4g} TFLOP/s<extra></extra>",
            }
        )
    else:
        annotations.append(_note(f"Ceilings not measured on {kind}: no roof drawn."))
    if bw and peak:
        annotations.append(_note(f"roof: copy {bw:,.0f} GB/s, bf16 matmul {peak:,.0f} TFLOP/s"))
    problems = sorted({p["problem"] for p in shown})
    for problem in problems:
        rows = [p for p in shown if p["problem"] == problem]
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": problem,
                "x": [p["intensity"] for p in rows],
                "y": [p["tflops"] for p in rows],
                "customdata": [[p.get("url") or "", p.get("label") or ""] for p in rows],
                "marker": {
                    "size": 8,
                    "color": kind_colour(problem, problems),
                    "symbol": [
                        "circle" if p.get("status") == "kept" else "circle-open" for p in rows
                    ],
                },
                "hovertemplate": (
                    "%{customdata[1]}<br>%{x:.3g} FLOP/byte, %{y:.4g} TFLOP/s"
                    "<br>click to open the trial<extra>" + problem + "</extra>"
                ),
            }
        )
    if not usable:
        annotations.append(
            _note(
                f"No timed accepted candidate on {kind} yet.",
                y=0.5,
                x=0.5,
                xanchor="center",
                size=13,
            )
        )
    if left_out:
        total = len(usable) + left_out
        annotations.append(
            _note(
                f"showing {len(shown):,} of {total:,} candidates: the {per_problem:,} fastest "
                "of each problem",
                y=1.06,
            )
        )
    elif dropped:
        annotations.append(_note(_decimation_note(len(shown), dropped, "candidates"), y=1.06))
    layout = _layout(
        title,
        xaxis={
            "title": {"text": "arithmetic intensity (FLOP/byte, log)"},
            "type": "log",
            "dtick": 1,
        },
        yaxis={"title": {"text": "achieved TFLOP/s (log)"}, "type": "log", "dtick": 1},
        annotations=annotations,
        height=420,
    )
    layout["meta"].update(
        {
            "points": len(usable) + left_out,
            "shown": len(shown),
            "decimated": dropped + left_out,
        }
    )
    return {"data": traces, "layout": layout}


# -- failure taxonomy --------------------------------------------------------------------------


def failure_shares(counts: Sequence[dict[str, Any]], *, title: str | None = None) -> dict[str, Any]:
    """Share of judged trials by outcome (kept, reverted, each failure category), one bar per
    proposer / model. Rows: ``{"group", "outcome", "count"}``."""
    title = title or "Outcome of trials per proposer / model"
    groups = sorted({r["group"] for r in counts if r["count"]})
    if not groups:
        return empty(title, "No judged trial yet: the failure picture fills in as trials finish.")
    totals = {g: sum(r["count"] for r in counts if r["group"] == g) for g in groups}
    return _share_bars(
        title, counts, groups, totals, axis_title="proposer / model", horizontal=True
    )


def failures_over_time(
    counts: Sequence[dict[str, Any]], *, bucket: str, title: str | None = None
) -> dict[str, Any]:
    """Share of judged trials by outcome per time bucket (``"group"`` is the bucket's start)."""
    title = title or f"Outcome of trials per {bucket}"
    buckets = sorted({r["group"] for r in counts if r["count"]})
    if not buckets:
        return empty(title, "No judged trial yet: the failure picture fills in as trials finish.")
    totals = {b: sum(r["count"] for r in counts if r["group"] == b) for b in buckets}
    return _share_bars(title, counts, buckets, totals, axis_title=f"{bucket} (UTC)")


def _share_bars(
    title: str,
    counts: Sequence[dict[str, Any]],
    groups: list[str],
    totals: dict[str, int],
    *,
    axis_title: str,
    horizontal: bool = False,
) -> dict[str, Any]:
    index = {(r["group"], r["outcome"]): r["count"] for r in counts}
    share, group = ("x", "y") if horizontal else ("y", "x")
    traces = []
    for outcome in OUTCOMES:
        shares, numbers = [], []
        for g in groups:
            n = index.get((g, outcome), 0)
            shares.append(round(100 * n / totals[g], 2) if totals[g] else 0)
            numbers.append([n, totals[g]])
        if not any(numbers_n for numbers_n, _ in numbers):
            continue
        label = outcome.replace("_", " ")
        trace = {
            "type": "bar",
            "name": label,
            "marker": {"color": OUTCOME_COLOURS[outcome]},
            "customdata": numbers,
            "hovertemplate": (
                f"{label}: %{{customdata[0]}} of %{{customdata[1]}} trials"
                f" (%{{{share}:.1f}}%)<extra>%{{{group}}}</extra>"
            ),
        }
        if horizontal:
            trace.update(x=shares, y=groups, orientation="h")
        else:
            trace.update(x=groups, y=shares)
        traces.append(trace)
    share_axis = {"title": {"text": "share of judged trials"}, "range": [0, 100], "ticksuffix": "%"}
    group_axis = {"title": {"text": axis_title}, "type": "category", "automargin": True}
    failed = sum(r["count"] for r in counts if r["outcome"] not in ("kept", "reverted"))
    total = sum(totals.values())
    layout = _layout(
        title,
        barmode="stack",
        xaxis=share_axis if horizontal else group_axis,
        yaxis=group_axis if horizontal else share_axis,
        annotations=[
            _note(f"{failed:,} of {total:,} judged trials failed ({100 * failed / total:.0f}%)")
        ],
        height=max(300, 140 + 34 * len(groups)) if horizontal else 340,
    )
    layout["meta"].update({"judged": total, "failed": failed})
    return {"data": traces, "layout": layout}


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
        xs, ys, custom = [], [], []
        for k in usable:
            run = next((r for r in k["runs"] if r["kind"] == kind), None)
            value = _positive(run.get("speedup_eager")) if run else None
            if value is None:
                continue
            xs.append(k["label"])
            ys.append(value)
            compiled = _positive(run.get("speedup_compiled"))
            custom.append([run.get("url") or "", f"{compiled:.2f}×" if compiled else "—"])
        traces.append(
            {
                "type": "bar",
                "name": kind,
                "x": xs,
                "y": ys,
                "customdata": custom,
                "marker": {"color": kind_colour(kind, kinds)},
                "hovertemplate": (
                    "%{x} on " + kind + ": %{y:.2f}× vs eager, %{customdata[1]} vs torch.compile"
                    "<extra></extra>"
                ),
            }
        )
    layout = _layout(
        title,
        barmode="group",
        xaxis={"title": {"text": "kernel"}, "type": "category", "automargin": True},
        yaxis=_speedup_axis(),
        shapes=[_parity_line()],
    )
    return {"data": traces, "layout": layout}


def trace_names(figure: dict[str, Any]) -> list[str]:
    return [t.get("name", "") for t in figure.get("data", [])]


def points(figure: dict[str, Any], name: str) -> Iterable[tuple[Any, Any]]:
    """(x, y) pairs of the trace called `name` (tests and debugging)."""
    for trace in figure.get("data", []):
        if trace.get("name") == name:
            return list(zip(trace.get("x", []), trace.get("y", []), strict=False))
    return []
