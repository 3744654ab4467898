"""RQ tasks: take ids, load rows, call the orchestrator. No logic here."""

from __future__ import annotations


def run_search(search_id: int) -> str:
    from searches.orchestrator import run_search as loop

    return loop(search_id)
