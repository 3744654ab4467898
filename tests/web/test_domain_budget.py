from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from searches import services
from searches.models import Search, StopReason
from tests.web.domain import accepted, idea_kwargs, judge, propose, rejected

pytestmark = pytest.mark.django_db


def _running(engineer, patience: int = 20, **budget) -> Search:
    idea = services.create_idea(**idea_kwargs(engineer, **budget))
    queued = services.start_search(idea=idea, user=engineer, plateau_patience=patience)
    return services.begin_search(search=queued)


def _budget(search: Search, now=None) -> str | None:
    return services.check_budget(search=Search.objects.get(pk=search.pk), now=now)


def test_a_fresh_search_has_budget_left(engineer):
    assert _budget(_running(engineer)) is None


def test_the_trial_budget_counts_proposals(engineer):
    search = _running(engineer, max_trials=3)
    for i in range(2):
        propose(search, i)
    assert _budget(search) is None
    propose(search, 2)
    assert _budget(search) == "budget: trials (3 of 3)"


def test_the_gpu_budget_counts_recorded_gpu_seconds(engineer):
    search = _running(engineer, max_gpu_minutes=1)
    judge(propose(search, 1), accepted(), gpu_seconds=59.0)
    assert _budget(search) is None
    judge(propose(search, 2), rejected("timeout"), gpu_seconds=1.0)
    assert _budget(search).startswith(StopReason.BUDGET_GPU_MINUTES)
    assert Search.objects.get().gpu_seconds == 60.0


def test_the_wall_budget_counts_from_the_start(engineer):
    search = _running(engineer, max_wall_minutes=10)
    started = Search.objects.get().started_at
    assert _budget(search, now=started + timedelta(minutes=9, seconds=59)) is None
    reason = _budget(search, now=started + timedelta(minutes=10))
    assert reason == "budget: wall time (10.0 of 10 minutes)"


def test_the_token_budget_counts_prompt_and_completion_tokens(engineer):
    search = _running(engineer, proposer="llm:gpt-4o", max_tokens=1000)
    propose(search, 1, proposer="llm:gpt-4o", model="gpt-4o", tokens_in=600, tokens_out=399)
    assert _budget(search) is None
    propose(search, 2, proposer="llm:gpt-4o", model="gpt-4o", tokens_in=1, tokens_out=0)
    assert _budget(search) == "budget: tokens (1000 of 1000)"


def test_without_a_token_budget_tokens_never_stop_a_search(engineer):
    search = _running(engineer, max_tokens=None)
    propose(search, 1, tokens_in=10**9)
    assert _budget(search) is None


def test_a_plateau_counts_only_after_the_first_incumbent(engineer):
    search = _running(engineer, patience=3)
    for i in range(5):  # failures before any incumbent: nothing to improve on yet
        judge(propose(search, i), rejected("incorrect"))
    assert Search.objects.get().trials_since_improvement == 0
    assert _budget(search) is None

    judge(propose(search, 10), accepted(ms=0.5))
    judge(propose(search, 11), accepted(ms=0.6))  # reverted
    judge(propose(search, 12), rejected("crashed"))  # failed
    assert _budget(search) is None
    judge(propose(search, 13), accepted(ms=0.5))  # reverted: not beyond noise
    assert _budget(search) == "plateau (3 trials in a row without a new incumbent)"


def test_a_new_incumbent_resets_the_plateau(engineer):
    search = _running(engineer, patience=3)
    judge(propose(search, 1), accepted(ms=0.5))
    judge(propose(search, 2), accepted(ms=0.6))
    judge(propose(search, 3), accepted(ms=0.6001))
    judge(propose(search, 4), accepted(ms=0.3))  # kept
    assert Search.objects.get().trials_since_improvement == 0
    assert _budget(search) is None


def test_budgets_are_checked_in_a_fixed_order(engineer):
    search = _running(engineer, max_trials=1, max_gpu_minutes=1)
    judge(propose(search, 1), accepted(), gpu_seconds=120)
    assert _budget(search, now=timezone.now()).startswith(StopReason.BUDGET_TRIALS)
