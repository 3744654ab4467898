"""Per proposer and model, for the search page: how often its candidates pass the harness, the
best speedup, tokens, cost, and its failures by category."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db.models import Count, Max, Q, Sum

from searches.models import FAILURES, Search, Trial

ACCEPTED = (Trial.Status.KEPT, Trial.Status.REVERTED)


def per_model(search: Search) -> list[dict[str, Any]]:
    rows = (
        Trial.objects.filter(search=search)
        .values("proposer", "model")
        .annotate(
            total=Count("id"),
            kept=Count("id", filter=Q(status=Trial.Status.KEPT)),
            accepted=Count("id", filter=Q(status__in=ACCEPTED)),
            failed=Count("id", filter=Q(status=Trial.Status.FAILED)),
            best_speedup=Max("speedup_eager", filter=Q(status__in=ACCEPTED)),
            tokens_in=Sum("tokens_in"),
            tokens_out=Sum("tokens_out"),
            cost=Sum("cost_usd"),
        )
        .order_by("proposer", "model")
    )
    failures: dict[tuple[str, str | None], Counter] = {}
    for proposer, model, failure in Trial.objects.filter(
        search=search, status=Trial.Status.FAILED
    ).values_list("proposer", "model", "failure"):
        failures.setdefault((proposer, model), Counter())[failure] += 1
    out = []
    for row in rows:
        judged = row["accepted"] + row["failed"]
        counts = failures.get((row["proposer"], row["model"]), Counter())
        out.append(
            {
                **row,
                "judged": judged,
                "success_rate": row["accepted"] / judged if judged else None,
                "failures": [(name, counts[name]) for name in FAILURES if counts[name]],
            }
        )
    return out
