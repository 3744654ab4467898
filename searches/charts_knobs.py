"""The knob sweep of a search: a parallel-coordinates plot, one axis per `# tune:` knob and a
last one for the speedup vs eager, one line per timed trial, coloured by that speedup.

Built with plotly's `graph_objects` (which validates the figure) and handed over as plain JSON,
like the figures of `searches.charts`; an empty sweep is `charts.empty(...)` with its reason.
A knob whose choices are all numbers gets a numeric axis; any other knob (strings, booleans)
an axis of its choices in declared order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from searches import charts

TITLE = "Knob sweep: speedup vs eager by knob values"
MAX_LINES = charts.MAX_POINTS


def _numeric(choices: Sequence[Any]) -> bool:
    return all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices)


def _dimension(knob: Any, values: list[Any]) -> dict[str, Any]:
    choices = list(knob.choices)
    if _numeric(choices):
        ticks = sorted(set(choices))
        return {
            "label": knob.name,
            "values": [float(v) for v in values],
            "tickvals": ticks,
            "range": [min(ticks), max(ticks)] if len(ticks) > 1 else [ticks[0] - 1, ticks[0] + 1],
        }
    return {
        "label": knob.name,
        "values": [choices.index(v) for v in values],
        "tickvals": list(range(len(choices))),
        "ticktext": [str(c) for c in choices],
        "range": [0, max(len(choices) - 1, 1)],
    }


def knob_sweep(knobs: Sequence[Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`knobs`: the search's knobs (name, choices); `rows`: timed trials, newest first, as
    {"index", "values" (the trial's knob values), "speedup_eager"}."""
    if not knobs:
        return charts.empty(
            TITLE, "The search's kernel declares no # tune: knobs, so there is no sweep to plot."
        )
    lines: list[tuple[int, list[Any], float]] = []
    left_out = 0
    for row in rows:
        values = row.get("values") if isinstance(row.get("values"), dict) else {}
        speedup = row.get("speedup_eager")
        picked = [values.get(k.name) for k in knobs]
        fits = all(v in k.choices and v is not None for v, k in zip(picked, knobs, strict=True))
        if not fits or not isinstance(speedup, int | float) or not math.isfinite(speedup):
            left_out += 1  # an LLM's rewrite off the knobs' choices, or no number
            continue
        if len(lines) < MAX_LINES:
            lines.append((row["index"], picked, float(speedup)))
    if not lines:
        return charts.empty(
            TITLE,
            "No timed trial with knob values yet: trials on the CPU interpreter are not timed.",
        )
    speedups = [s for _, _, s in lines]
    dimensions = [
        _dimension(knob, [picked[i] for _, picked, _ in lines]) for i, knob in enumerate(knobs)
    ]
    dimensions.append({"label": "vs eager (×)", "values": speedups})
    figure = go.Figure(
        go.Parcoords(
            line={
                "color": speedups,
                "colorscale": "Viridis",
                "showscale": True,
                "colorbar": {"title": {"text": "vs eager"}, "ticksuffix": "×"},
            },
            dimensions=dimensions,
        ),
        layout={
            "template": "none",
            "title": {"text": TITLE, "x": 0, "xanchor": "left", "font": {"size": 14}},
            "margin": {"l": 60, "r": 40, "t": 80, "b": 30},
            "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif"},
            "meta": {"empty": False, "lines": len(lines), "left_out": left_out},
        },
    )
    if left_out:
        figure.add_annotation(
            text=f"{len(lines)} trials drawn; {left_out} left out (no timing, or a knob value "
            "off its choices)",
            xref="paper",
            yref="paper",
            x=0,
            y=1.12,
            showarrow=False,
            font={"size": 11, "color": "#5b6575"},
        )
    return json.loads(figure.to_json())
