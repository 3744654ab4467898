"""Helpers for the domain tests: idea arguments, distinct candidates, harness reports."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from kernels import problems as registry
from searches import orchestrator, services
from searches.models import Search, Trial

SOFTMAX_SEED = registry.load("softmax").seed_path.read_text()


def idea_kwargs(author: Any, **overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "author": author,
        "title": "Wider blocks for softmax",
        "description": "Try **larger** BLOCK_N.",
        "problem": "softmax",
        "target_kinds": ["h200"],
        "proposer": "tuner",
        "sketch_source": "",
        "prohibitions": "no torch.softmax\nno fp16 accumulation\n",
        "max_trials": 50,
        "max_gpu_minutes": 30,
        "max_wall_minutes": 60,
        "max_tokens": None,
    }
    kwargs.update(overrides)
    return kwargs


def queue_search(author: Any, *, start: dict[str, Any] | None = None, **overrides: Any) -> Search:
    """An idea (`idea_kwargs` with the overrides), its search started with `start` and its loop
    queued for an orchestrator, as the idea form and the start button do."""
    idea = services.create_idea(**idea_kwargs(author, **overrides))
    with transaction.atomic():
        search = services.start_search(idea=idea, user=author, **(start or {}))
        orchestrator.enqueue_search(search)
    return search


def variant(i: int) -> str:
    """A distinct, valid softmax candidate."""
    return SOFTMAX_SEED + f"\n# variant {i}\n"


def propose(search: Search, i: int, **extra: Any) -> Trial:
    kwargs: dict[str, Any] = {"parent": None, "proposer": "tuner"}
    kwargs.update(extra)
    return services.record_proposal(search=search, source=variant(i), **kwargs)


def accepted(ms: float | None = 0.5, noise: float | None = 0.01, kind: str = "h200") -> dict:
    """A minimal accepted report (the harness's schema); ms=None is an untimed run."""
    return {
        "verdict": "accepted",
        "failure": None,
        "reasons": [],
        "summary": {
            "geomean_ms": ms,
            "noise": noise,
            "geomean_speedup_eager": None if ms is None else 0.6 / ms,
            "geomean_speedup_compiled": None if ms is None else 0.55 / ms,
        },
        "device": {
            "kind": kind,
            "name": "Triton CPU interpreter" if kind == "interpret" else "NVIDIA H200",
            "versions": {"torch": "2.11.0", "triton": "3.6.0"},
        },
        "checks": {},
        "shapes": [],
    }


def interpreted() -> dict:
    return accepted(ms=None, noise=None, kind="interpret")


def rejected(failure: str = "incorrect", *reasons: str) -> dict:
    return {
        "verdict": "rejected",
        "failure": failure,
        "reasons": list(reasons) or [f"{failure}: max abs error 0.3 at shape M=4097,N=1000"],
        "summary": {"geomean_ms": None, "noise": None},
        "device": {"kind": "h200", "name": "NVIDIA H200", "versions": {}},
    }


def judge(trial: Trial, report: dict, gpu_seconds: float = 2.0, *, confirm: bool = True) -> Trial:
    """Record a result as the orchestrator does; a screening win is then confirmed by a re-time
    that repeats both sides' screening numbers (`confirm=False` leaves it confirming)."""
    trial = services.record_result(trial=trial, report=report, gpu_seconds=gpu_seconds)
    if confirm and trial.status == Trial.Status.CONFIRMING:
        trial = confirmed(trial)
    return trial


def confirmed(trial: Trial, retimed: list[dict] | None = None) -> Trial:
    """Record the confirming trial's interleaved re-time: `retimed` ([incumbent, challenger]),
    by default both sides' own screening numbers again."""
    trial.refresh_from_db()
    if retimed is None:
        against = Trial.objects.get(pk=trial.confirmation["against"])
        retimed = [against.numbers().as_dict(), trial.numbers().as_dict()]
    return services.record_confirmation(trial=trial, report=retimed)
