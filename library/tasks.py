"""RQ tasks: take ids, load rows, call the watcher. No logic here."""

from __future__ import annotations


def watch_review(review_id: int) -> str:
    from library.watch import watch

    return watch(review_id)
