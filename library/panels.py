"""A trial's review status, for the trial page: decided (by whom, and how it ended), waiting
in the review queue, or why it is not a candidate (library.selectors.why_not_candidate)."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string

from library import selectors, services


def review_panel(trial: Any) -> str:
    """The panel's HTML (the trial page shows it through `searches.hooks`)."""
    return render_to_string("library/partials/review_status.html", _context(trial))


def _context(trial: Any) -> dict[str, Any]:
    status = selectors.review_status(trial)
    review = status.get("review")
    if review is not None:
        status["past"] = services.PAST[review.action]
    if review is not None and review.action == review.Action.APPROVE:
        revals = list(review.revalidations.all())
        waits = selectors.revalidation_states(revals)
        status["waiting"] = [waits[r.pk] for r in revals if r.pk in waits]
    return {"trial": trial, **status}
