"""Chart pages and fragments: the GPUs page, and the chart sections that the dashboard, the
search page and the problem page load with htmx (so the pages themselves stay fast).

Each view gathers rows (`searches.chart_data`), builds figures (`searches.charts`) and renders
`partials/chart.html` per figure. The search's charts also come as JSON
(``?format=json``): the page's script re-fetches them when the websocket says a trial finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core import roles
from searches import chart_data, charts, charts_knobs, selectors
from searches.fleet import fleet
from searches.models import Search


@dataclass
class Chart:
    """One figure on a page: `key` names it in the live JSON and in element ids."""

    key: str
    figure: dict[str, Any]
    wide: bool = False  # spans the whole row of a chart grid

    @property
    def empty(self) -> bool:
        return charts.is_empty(self.figure)

    @property
    def message(self) -> str:
        return self.figure["layout"]["meta"].get("message", "")

    @property
    def title(self) -> str:
        return self.figure["layout"]["title"]["text"]

    @property
    def dom_id(self) -> str:
        return f"chart-{self.key}"

    @property
    def script_id(self) -> str:
        return f"chart-{self.key}-data"


# -- figure sets -------------------------------------------------------------------------------


def _kind_key(kind: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in kind)


def speedup_charts(kinds: list[str]) -> list[Chart]:
    found = chart_data.best_found_by_kind()
    released = chart_data.releases_by_kind()
    timed = [k for k in kinds if k != chart_data.INTERPRET]
    if not timed:
        return [
            Chart(
                "speedup",
                charts.empty(
                    "Best speedup per problem",
                    "No GPU kind has timed results yet: start a worker on a GPU and a search.",
                ),
            )
        ]
    return [
        Chart(
            f"speedup-{_kind_key(kind)}",
            charts.speedup_by_problem(kind, found.get(kind, []), released.get(kind, [])),
            wide=True,
        )
        for kind in timed
    ]


def failure_charts(key: str, search: Search | None = None, kind: str | None = None) -> list[Chart]:
    rows, bucket = chart_data.outcome_counts_over_time(search, kind)
    return [
        Chart(f"{key}-failures", charts.failure_shares(chart_data.outcome_counts(search, kind))),
        Chart(f"{key}-failures-time", charts.failures_over_time(rows, bucket=bucket)),
    ]


def search_charts_for(search: Search) -> list[Chart]:
    return [
        Chart("progress", charts.search_progress(chart_data.progress_rows(search)), wide=True),
        Chart(
            "burndown",
            charts.budget_burndown(search.budget(), chart_data.burndown_events(search)),
        ),
        Chart(
            "knobs",
            charts_knobs.knob_sweep(selectors.search_knobs(search), chart_data.knob_rows(search)),
            wide=True,
        ),
        *failure_charts("search", search=search),
    ]


def gpu_sections() -> list[dict[str, Any]]:
    kinds = chart_data.gpu_kinds()
    ceilings = chart_data.ceilings_by_kind(kinds)
    found = chart_data.best_found_by_kind()
    released = chart_data.releases_by_kind()
    sections = []
    for kind in kinds:
        key = _kind_key(kind)
        items = []
        if kind != chart_data.INTERPRET:
            items.append(
                Chart(
                    f"speedup-{key}",
                    charts.speedup_by_problem(kind, found.get(kind, []), released.get(kind, [])),
                )
            )
            points, left_out = chart_data.roofline_points(kind)
            roofline = charts.roofline(
                kind,
                ceilings.get(kind),
                points,
                left_out=left_out,
                per_problem=chart_data.ROOFLINE_PER_PROBLEM,
            )
            items.append(Chart(f"roofline-{key}", roofline))
        items.extend(failure_charts(f"kind-{key}", kind=kind))
        sections.append(
            {
                "kind": kind,
                "key": key,
                "ceilings": ceilings.get(kind),
                "interpret": kind == chart_data.INTERPRET,
                "charts": items,
            }
        )
    return sections


def problem_charts_for(name: str) -> list[Chart]:
    shapes, columns = chart_data.heatmap_by_kind(name)
    items = [
        Chart(
            "heatmap-kinds",
            charts.shape_heatmap(
                f"{name}: speedup vs eager per shape, best kept kernel per GPU kind",
                shapes,
                columns,
                column_title="GPU kind",
            ),
        )
    ]
    for kind in chart_data.kinds_with_kept(name):
        shapes, columns = chart_data.heatmap_by_kernel(name, kind)
        items.append(
            Chart(
                f"heatmap-kernels-{_kind_key(kind)}",
                charts.shape_heatmap(
                    f"{name} on {kind}: speedup vs eager per shape, fastest kept kernels",
                    shapes,
                    columns,
                    column_title="kernel (search/trial)",
                ),
            )
        )
    items.append(
        Chart(f"cross-gpu-{_kind_key(name)}", charts.cross_gpu(chart_data.cross_gpu_kernels(name)))
    )
    return items


# -- views -------------------------------------------------------------------------------------


def _not_engineer(request: HttpRequest) -> HttpResponse:
    return render(request, "searches/partials/charts_engineers_only.html")


@require_GET
def gpus(request: HttpRequest) -> HttpResponse:
    engineer = roles.is_engineer(request.user)
    context: dict[str, Any] = {"engineer": engineer, "sections": [], "cross": None}
    if engineer:
        context["sections"] = gpu_sections()
        context["cross"] = Chart("cross-gpu", charts.cross_gpu(chart_data.cross_gpu_kernels()))
        # The live workers of each kind: host, last heartbeat, the job in flight.
        live = fleet(registered=False)
        context["redis_error"] = live.redis_error
        for section in context["sections"]:
            section["workers"] = [w for w in live.online if w.kind == section["kind"]]
    return render(request, "searches/gpus.html", context)


@require_GET
def dashboard_charts(request: HttpRequest) -> HttpResponse:
    if not roles.is_engineer(request.user):
        return _not_engineer(request)
    items = [*speedup_charts(chart_data.gpu_kinds()), *failure_charts("all")]
    return render(request, "searches/partials/charts.html", {"charts": items, "id": "dashboard"})


@require_GET
def problem_charts(request: HttpRequest, name: str) -> HttpResponse:
    if not roles.is_engineer(request.user):
        return _not_engineer(request)
    selectors.problem_detail(name)  # Http404 for a name not in the registry
    return render(
        request,
        "searches/partials/charts.html",
        {"charts": problem_charts_for(name), "id": "problem"},
    )


@require_GET
def search_charts(request: HttpRequest, pk: int) -> HttpResponse:
    search = selectors.search_for_user(request.user, pk)
    items = search_charts_for(search)
    if request.GET.get("format") == "json":
        return JsonResponse({"charts": {c.dom_id: c.figure for c in items}})
    return render(
        request,
        "searches/partials/charts.html",
        {"charts": items, "id": "search", "search": search},
    )
