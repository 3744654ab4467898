"""Pages. Each view parses the request, calls a selector or a service, and renders.

Login is required everywhere (LoginRequiredMiddleware); objects go through the access helpers in
selectors (PermissionDenied / Http404). Every change is a POST; an htmx request gets the partial
it swaps in, a plain one a redirect, so every page works without JavaScript.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import redis
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from core import rendering, roles
from core.errors import DomainError
from searches import fleet as fleet_module
from searches import live, selectors, services
from searches.fleet import fleet, measured_ceilings
from searches.forms import IdeaForm, TrialFilterForm
from searches.orchestrator import enqueue_search, settle_stop
from searches.reports import paired_shapes, report_view

log = logging.getLogger(__name__)

TRIALS_PER_PAGE = 50
QUEUE_FAILED = (
    "Saved, but the orchestrator's queue in Redis is unreachable ({error}); the search "
    "starts when Redis is back and the orchestrator restarts."
)


def _htmx(request: HttpRequest) -> bool:
    return bool(getattr(request, "htmx", False))


def _require_engineer(request: HttpRequest, action: str) -> None:
    if not roles.is_engineer(request.user):
        raise PermissionDenied(f"Only engineers may {action}. Ask an admin for the role.")


# -- dashboard, problems, workers -------------------------------------------------------------


@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    listing = selectors.list_problems()
    engineer = roles.is_engineer(request.user)
    return render(
        request,
        "searches/dashboard.html",
        {
            "engineer": engineer,
            "running": selectors.running_searches() if engineer else [],
            "wins": selectors.recent_wins() if engineer else [],
            "fleet": fleet(registered=False),
            "problems": listing.problems,
            "problem_errors": listing.errors,
        },
    )


@require_GET
def problem_list(request: HttpRequest) -> HttpResponse:
    listing = selectors.list_problems()
    return render(
        request,
        "searches/problems.html",
        {"problems": listing.problems, "problem_errors": listing.errors},
    )


@require_GET
def problem_detail(request: HttpRequest, name: str) -> HttpResponse:
    problem = selectors.problem_detail(name)
    roofline, unmeasured, redis_error = None, [], ""
    if not problem.get("error"):
        workers = fleet()
        ceilings = measured_ceilings(workers)
        roofline = selectors.problem_roofline(name, ceilings)
        kinds = {w.kind for w in workers.workers if w.kind and w.kind != "interpret"}
        unmeasured = sorted(kinds - set(ceilings))
        redis_error = workers.redis_error
    return render(
        request,
        "searches/problem.html",
        {
            "problem": problem,
            "reference_html": rendering.python(problem.get("reference_source", "")),
            "seed_html": rendering.python(problem.get("seed_source", "")),
            "roofline": roofline,
            "unmeasured_kinds": unmeasured,
            "fleet_error": redis_error,
        },
    )


@require_GET
def workers(request: HttpRequest) -> HttpResponse:
    return render(request, "searches/workers.html", {"fleet": fleet()})


# -- ideas ------------------------------------------------------------------------------------


def _idea_form(data: Any = None) -> IdeaForm:
    listing = selectors.list_problems()
    online = fleet(registered=False)
    from django.conf import settings

    from searches.agent import endpoints, packs

    models = [settings.AUTOWEB_DEFAULT_MODEL, *settings.AUTOWEB_LLM_MODELS]
    return IdeaForm(
        data,
        problems=[p["name"] for p in listing.builtin],
        user_problems=[p["name"] for p in listing.users],
        broken_problems=listing.broken,
        online_kinds=online.kinds,
        online_known=not online.redis_error,
        models=models,
        packs=list(packs.available("model")),
        endpoints=endpoints.choices(),
    )


@require_http_methods(["GET", "POST"])
def idea_new(request: HttpRequest) -> HttpResponse:
    # Checked up front: a non-engineer should not fill in a form only to be refused.
    _require_engineer(request, "submit ideas")
    if request.method == "GET":
        form = _idea_form()
        initial_problem = request.GET.get("problem")
        if initial_problem and form.fields["problem"].valid_value(initial_problem):
            form.initial["problem"] = initial_problem
        return render(request, "searches/idea_new.html", {"form": form})
    form = _idea_form(request.POST)
    if form.is_valid():
        try:
            idea = services.create_idea(author=request.user, **form.idea_kwargs())
        except DomainError as exc:
            form.add_domain_error(exc)
        else:
            url = reverse("searches:idea", args=[idea.pk])
            return HttpResponseClientRedirect(url) if _htmx(request) else redirect(url)
    if _htmx(request):  # htmx swaps only 2xx responses: the form with its errors
        return render(request, "searches/partials/idea_form.html", {"form": form})
    return render(request, "searches/idea_new.html", {"form": form}, status=400)


@require_GET
def idea_list(request: HttpRequest) -> HttpResponse:
    _require_engineer(request, "see ideas")
    return render(
        request, "searches/ideas.html", {"page": selectors.ideas_page(request.GET.get("page"))}
    )


@require_GET
def idea_detail(request: HttpRequest, pk: int) -> HttpResponse:
    idea = selectors.idea_for_user(request.user, pk)
    return render(
        request,
        "searches/idea.html",
        {
            "idea": idea,
            "description_html": rendering.markdown(idea.description),
            "sketch_html": rendering.python(idea.sketch_source) if idea.sketch_source else "",
            "searches": selectors.searches_of_idea(idea),
            # A fresh key per rendering: a double-clicked (or resent) form starts one search.
            "request_key": uuid.uuid4().hex,
        },
    )


@require_POST
def idea_start(request: HttpRequest, pk: int) -> HttpResponse:
    idea = selectors.idea_for_user(request.user, pk)
    search = None
    try:
        with transaction.atomic():
            search = services.start_search(
                idea=idea, user=request.user, request_key=request.POST.get("request_key") or None
            )
            enqueue_search(search)  # on commit
    except DomainError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("searches:idea", pk=idea.pk)
    except redis.RedisError as exc:  # raised on commit: the search is saved, not enqueued
        messages.warning(request, QUEUE_FAILED.format(error=type(exc).__name__))
        if search is None:
            return redirect("searches:idea", pk=idea.pk)
    return redirect("searches:search", pk=search.pk)


# -- searches ---------------------------------------------------------------------------------


@require_GET
def search_detail(request: HttpRequest, pk: int) -> HttpResponse:
    search = selectors.search_for_user(request.user, pk)
    filters = TrialFilterForm(request.GET, knobs=selectors.search_knobs(search))
    page = selectors.trials_page(
        search, request.GET.get("page"), TRIALS_PER_PAGE, query=filters.query()
    )
    context = {"search": search, "page": page, "filters": filters}
    if search.idea.model_name:  # an LLM search: its panel (model switch, per-model results)
        from searches.agent.views import panel_context

        context = {**panel_context(search, request.user), **context}
    if _htmx(request) and request.htmx.target == "trials":
        return render(request, "searches/partials/trials.html", context)
    if _htmx(request) and request.htmx.target == "search-status":
        return render(request, "searches/partials/search_status.html", context)
    return render(request, "searches/search.html", context)


def _control(
    request: HttpRequest,
    pk: int,
    action: Callable[..., Any],
    *,
    enqueue: bool = False,
    then: Callable[[int], None] | None = None,
) -> HttpResponse:
    search = selectors.search_for_user(request.user, pk)
    error = ""
    try:
        with transaction.atomic():
            changed = action(search=search, user=request.user)
            if enqueue:
                enqueue_search(changed)
            transaction.on_commit(lambda: live.search_changed(changed))
    except DomainError as exc:
        error = " ".join(exc.messages)
    except redis.RedisError as exc:
        error = QUEUE_FAILED.format(error=type(exc).__name__)
    else:
        if then is not None:
            try:
                then(pk)
            except redis.RedisError as exc:  # saved; an orchestrator settles it when it can
                log.warning("search %s: settling the stop failed: %s", pk, exc)
    if _htmx(request):
        search = selectors.search_for_user(request.user, pk)
        return render(
            request,
            "searches/partials/search_status.html",
            {"search": search, "control_error": error},
        )
    if error:
        messages.error(request, error)
    return redirect("searches:search", pk=pk)


@require_POST
def search_pause(request: HttpRequest, pk: int) -> HttpResponse:
    return _control(request, pk, services.pause_search)


@require_POST
def search_resume(request: HttpRequest, pk: int) -> HttpResponse:
    return _control(request, pk, services.resume_search, enqueue=True)


@require_POST
def search_stop(request: HttpRequest, pk: int) -> HttpResponse:
    # Nothing of it running (say, a trial waits for a kind with no worker online): it ends now.
    return _control(request, pk, services.stop_search, then=settle_stop)


# -- trials -----------------------------------------------------------------------------------


@require_GET
def trial_detail(request: HttpRequest, pk: int, index: int) -> HttpResponse:
    trial = selectors.trial_for_user(request.user, pk, index)
    parent = trial.parent
    diff_html = ""
    if parent is not None:
        diff_html = rendering.diff(
            parent.source,
            trial.source,
            f"trial {parent.index}",
            f"trial {trial.index}",
        )
    return render(
        request,
        "searches/trial.html",
        {
            "trial": trial,
            "search": trial.search,
            "parent": parent,
            "source_html": rendering.python(trial.source),
            "diff_html": diff_html,
            "report": report_view(trial.report),
            "waiting": fleet_module.trial_waiting(trial),
        },
    )


@require_GET
def trial_compare(request: HttpRequest, pk: int) -> HttpResponse:
    """Two trials of a search side by side: the source diff and both reports' numbers."""
    search = selectors.search_for_user(request.user, pk)
    a, b = request.GET.get("a", ""), request.GET.get("b", "")
    if not (a.isdigit() and b.isdigit()):
        return render(
            request,
            "searches/compare.html",
            {"search": search, "error": "Give two trial numbers, e.g. ?a=3&b=7.", "a": a, "b": b},
            status=400,
        )
    first, second = selectors.compare_trials(request.user, pk, a, b)
    names = (f"trial {first.index}", f"trial {second.index}")
    return render(
        request,
        "searches/compare.html",
        {
            "search": search,
            "first": first,
            "second": second,
            "a": first.index,
            "b": second.index,
            "diff": rendering.source_diff(first.source, second.source, *names),
            "sides": [(first, report_view(first.report)), (second, report_view(second.report))],
            "shapes": paired_shapes(
                report_view(first.report).shapes, report_view(second.report).shapes
            ),
            "knobs": _knob_rows(first.knob_values, second.knob_values),
        },
    )


def _knob_rows(first: Any, second: Any) -> list[tuple[str, Any, Any]]:
    """(knob, first's value, second's value) for every knob either trial set; None: not set."""
    first = first if isinstance(first, dict) else {}
    second = second if isinstance(second, dict) else {}
    return [(name, first.get(name), second.get(name)) for name in sorted({*first, *second})]
