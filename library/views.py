"""Review queue, review page and actions, releases, export. Parse, call, render.

Viewing needs the engineer role (reviewers are engineers); every action is a POST that needs
the reviewer role, checked again in the service. GET never changes anything.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core import rendering, roles
from core.errors import DomainError
from kernels import problems as registry
from library import export, selectors, services
from library.models import Release, Review
from searches.models import Trial
from searches.reports import report_view


def _require_engineer(request: HttpRequest) -> None:
    if not roles.is_engineer(request.user):
        raise PermissionDenied("Only engineers and reviewers may see reviews and releases.")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    _require_engineer(request)
    q = request.GET
    result = selectors.review_queue(
        problem=q.get("problem") or None,
        kind=q.get("kind") or None,
        search=_int(q.get("search")),
        min_speedup=_float(q.get("min_speedup")),
        max_age_days=_float(q.get("max_age_days")),
        sort=q.get("sort") or selectors.DEFAULT_SORT,
    )
    context = {
        "queue": result,
        "why_empty": selectors.why_queue_is_empty(result),
        "sorts": list(selectors.SORTS),
        "counts": selectors.reviewer_counts(),
        "recent": Review.objects.select_related("trial__search__idea", "reviewer")[:20],
    }
    if getattr(request, "htmx", False) and request.htmx.target == "queue-table":
        return render(request, "library/partials/queue_table.html", context)
    return render(request, "library/queue.html", context)


def _trial(request: HttpRequest, pk: int) -> Trial:
    _require_engineer(request)
    try:
        return Trial.objects.select_related("search__idea", "parent", "imported").get(pk=pk)
    except Trial.DoesNotExist:
        raise Http404(f"No trial {pk}.") from None


def _range_rows(trial: Trial, review: Review | None) -> list[dict[str, Any]]:
    default = services.measured_range(trial)
    chosen = review.shape_range if review is not None else {}
    rows = []
    for dim in services.problem_dims(trial.search.idea.problem):
        lo, hi = chosen.get(dim) or default.get(dim) or [1, 1]
        rows.append({"dim": dim, "lo": lo, "hi": hi})
    return rows


@require_GET
def review(request: HttpRequest, pk: int) -> HttpResponse:
    trial = _trial(request, pk)
    search = trial.search
    existing = Review.objects.filter(trial=trial).select_related("reviewer").first()
    seed = search.idea.start_source()
    parent = trial.parent
    revalidations = list(existing.revalidations.all()) if existing else []
    waiting = selectors.revalidation_states(revalidations)
    for reval in revalidations:
        reval.view = report_view(reval.report)
        reval.waiting = waiting.get(reval.pk, "")
    context = {
        "trial": trial,
        "search": search,
        "parent": parent,
        "existing": existing,
        "why_not": selectors.why_not_candidate(trial),
        "reviewer": roles.is_reviewer(request.user),
        "diff_parent": rendering.source_diff(
            parent.source, trial.source, f"trial {parent.index}", f"trial {trial.index}"
        )
        if parent
        else None,
        "diff_seed": rendering.source_diff(seed, trial.source, "seed", f"trial {trial.index}"),
        "source_html": rendering.python(trial.source),
        "report": report_view(trial.report),
        "lineage": selectors.lineage(trial),
        "range_rows": _range_rows(trial, existing),
        "request_key": uuid.uuid4().hex,
        "revalidations": revalidations,
        "waiting": list(waiting.values()),
        "releases": list(trial.releases.all()),
        "notes": selectors.review_notes_for_search(search),
    }
    return render(request, "library/review.html", context)


@require_POST
def decide(request: HttpRequest, pk: int) -> HttpResponse:
    if not roles.is_reviewer(request.user):
        raise PermissionDenied("Only reviewers may approve, veto or send back candidates.")
    trial = _trial(request, pk)
    post = request.POST
    action = post.get("action", "")
    shape_range = None
    if action == Review.Action.APPROVE:
        shape_range = {
            dim: [post.get(f"range_{dim}_lo"), post.get(f"range_{dim}_hi")]
            for dim in services.problem_dims(trial.search.idea.problem)
        }
    try:
        done = services.decide(
            trial=trial,
            user=request.user,
            action=action,
            text=post.get("text", ""),
            prohibit=post.get("prohibit") == "on",
            shape_range=shape_range,
            request_key=post.get("request_key") or None,
        )
    except DomainError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("library:review", pk=trial.pk)
    what = services.PAST[done.action]
    extra = ""
    if done.action == Review.Action.APPROVE:
        extra = " Re-validation is queued on every target GPU kind."
        waits = selectors.revalidation_states(list(done.revalidations.all())).values()
        extra += "".join(f" {w[0].upper()}{w[1:]}." for w in waits if w.startswith("awaiting"))
    messages.success(request, f"Trial {trial.index} {what}.{extra}")
    return redirect("library:review", pk=trial.pk)


def _releases_query(query: Any) -> str:
    """The releases page's filters and page number as a querystring (blank ones left out): what
    the pager links and the revoke forms carry, so that the user stays where they were."""
    page = str(query.get("page") or "")
    kept = {
        **selectors.release_filters(query),
        "page": page if page.isascii() and page.isdigit() else "",
    }
    return urlencode({name: value for name, value in kept.items() if value})


@require_GET
def releases(request: HttpRequest) -> HttpResponse:
    _require_engineer(request)
    filters = selectors.release_filters(request.GET)
    page = selectors.releases_page(**filters, page=request.GET.get("page"))
    awaiting = selectors.awaiting_revalidation()
    waiting = selectors.revalidation_states(awaiting)
    for reval in awaiting:
        reval.waiting = waiting.get(reval.pk, "")
    return render(
        request,
        "library/releases.html",
        {
            "page": page,
            "awaiting": awaiting,
            "filters": filters,
            "query": urlencode({name: value for name, value in filters.items() if value}),
            "here": _releases_query({**filters, "page": page.page}),
            "summary": selectors.release_summary(problem=filters["problem"], kind=filters["kind"]),
            "reviewer": roles.is_reviewer(request.user),
            "problems": registry.names(),
            "kinds": selectors.release_kinds(),
            "states": selectors.RELEASE_STATES,
        },
    )


@require_GET
def release(request: HttpRequest, pk: int) -> HttpResponse:
    """One release: its range, speedups, provenance and per-shape dispatch table."""
    _require_engineer(request)
    rows = Release.objects.select_related("trial__imported", "approver", "revoked_by")
    rel = get_object_or_404(rows, pk=pk)
    context = {
        "r": rel,
        "dispatch": selectors.release_dispatch(rel),
        "reviewer": roles.is_reviewer(request.user),
    }
    if getattr(request, "htmx", False):  # the releases list opening a release's table
        return render(request, "library/partials/dispatch.html", context)
    return render(request, "library/release.html", context)


@require_POST
def revoke(request: HttpRequest, pk: int) -> HttpResponse:
    if not roles.is_reviewer(request.user):
        raise PermissionDenied("Only reviewers may revoke releases.")
    release = get_object_or_404(Release, pk=pk)
    was_active = release.active
    try:
        services.revoke_release(
            release=release, user=request.user, reason=request.POST.get("reason", "")
        )
    except DomainError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        if was_active:
            messages.success(
                request, f"Release {release.pk} revoked: no longer dispatched or exported."
            )
        else:  # a second submit of the same form: the service changed nothing
            messages.info(request, f"Release {release.pk} was already revoked.")
    # Back to the page and filters the form was on (rebuilt from known fields, never a URL).
    query = _releases_query(QueryDict(request.POST.get("return_query", "")))
    return redirect(reverse("library:releases") + (f"?{query}" if query else ""))


@require_GET
def download(request: HttpRequest) -> HttpResponse:
    """The active releases (filtered by ?problem=&kind=, repeatable) as a wheel."""
    _require_engineer(request)
    problems = [p for p in request.GET.getlist("problem") if p]
    kinds = [k for k in request.GET.getlist("kind") if k]
    known = set(registry.names())
    if any(p not in known for p in problems):
        raise Http404("Unknown problem.")
    try:
        name, data = export.wheel_bytes(export.select(problems, kinds), extra_problems=problems)
    except export.ExportError as e:  # a problem asked for that does not load
        return HttpResponseBadRequest(str(e), content_type="text/plain; charset=utf-8")
    response = HttpResponse(data, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
