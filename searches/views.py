from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from searches.selectors import list_problems


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    listing = list_problems()
    return render(
        request,
        "searches/dashboard.html",
        {"problems": listing.problems, "problem_errors": listing.errors},
    )
