"""Which candidates enter the review queue, filtering, sorting, counts per reviewer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from library import selectors, services
from library.models import Review
from searches import services as search_services
from searches.models import Trial
from tests.library.helpers import candidate
from tests.web.domain import idea_kwargs, interpreted, variant

pytestmark = pytest.mark.django_db


def queued(**kw):
    return [t.pk for t in selectors.review_queue(**kw).trials]


def test_a_kept_candidate_faster_than_both_baselines_beyond_noise_enters(search):
    trial = candidate(search)
    assert trial.status == Trial.Status.KEPT
    assert queued() == [trial.pk]
    assert selectors.why_not_candidate(trial) is None


@pytest.mark.parametrize(
    ("report_kw", "why"),
    [
        ({"eager": 0.5 * 1.005}, "eager"),  # 1.005x vs eager, noise 1%
        ({"compiled": 0.5 * 1.005}, "torch.compile"),
        ({"eager": 0.4, "compiled": 0.4}, "eager"),  # slower than eager
        ({"checks": {"cuda_graph": {"passed": False, "detail": "breaks capture"}}}, "cuda_graph"),
    ],
)
def test_a_candidate_not_beyond_noise_or_with_a_failed_check_stays_out(search, report_kw, why):
    trial = candidate(search, **report_kw)
    assert trial.status == Trial.Status.KEPT  # kept: it was the first correct candidate
    assert queued() == []
    assert why in selectors.why_not_candidate(trial)


def test_torch_compile_not_measured_does_not_keep_a_candidate_out(search):
    trial = candidate(search, compiled=None)
    assert queued() == [trial.pk]


def test_an_untimed_interpreter_incumbent_stays_out(search):
    trial = search_services.record_proposal(
        search=search, source=variant(99), parent=None, proposer="tuner"
    )
    trial = search_services.record_result(trial=trial, report=interpreted(), gpu_seconds=0)
    assert trial.status == Trial.Status.KEPT
    assert queued() == []


def test_reverted_and_superseded_trials_stay_out(search):
    first = candidate(search, ms=0.5)
    slower = candidate(search, ms=0.52, parent=first)
    assert slower.status == Trial.Status.REVERTED
    better = candidate(search, ms=0.3, parent=first)
    assert better.status == Trial.Status.KEPT
    assert queued() == [better.pk]
    assert "replaced" in selectors.why_not_candidate(Trial.objects.get(pk=first.pk))


def test_a_decided_candidate_leaves_the_queue(search, reviewer):
    trial = candidate(search)
    services.decide(trial=trial, user=reviewer, action="veto", text="uses fp16 accumulation")
    assert queued() == []


@pytest.fixture
def mixed(engineer):
    """Candidates on two problems, two GPU kinds, three searches, of different ages."""
    out = {}
    for name, problem, kind, eager, age_days in (
        ("softmax_h200", "softmax", "h200", 0.9, 0),
        ("softmax_h100", "softmax", "h100", 0.7, 3),
        ("rmsnorm_h200", "rmsnorm", "h200", 0.6, 10),
    ):
        idea = search_services.create_idea(**idea_kwargs(engineer, problem=problem))
        search = search_services.begin_search(
            search=search_services.start_search(idea=idea, user=engineer, seed=1)
        )
        src = None
        if problem == "rmsnorm":
            from kernels import problems

            src = problems.load("rmsnorm").seed_path.read_text()
        trial = candidate(search, src, eager=eager, kind=kind)
        Trial.objects.filter(pk=trial.pk).update(
            finished_at=timezone.now() - timedelta(days=age_days)
        )
        out[name] = trial.pk
    return out


def test_the_queue_filters_by_problem_kind_search_speedup_and_age(mixed):
    assert set(queued()) == set(mixed.values())
    assert set(queued(problem="softmax")) == {mixed["softmax_h200"], mixed["softmax_h100"]}
    assert queued(kind="h100") == [mixed["softmax_h100"]]
    search_id = Trial.objects.get(pk=mixed["rmsnorm_h200"]).search_id
    assert queued(search=search_id) == [mixed["rmsnorm_h200"]]
    assert queued(min_speedup=1.5) == [mixed["softmax_h200"]]  # 1.8x; others 1.4x, 1.2x
    assert set(queued(max_age_days=5)) == {mixed["softmax_h200"], mixed["softmax_h100"]}
    result = selectors.review_queue()
    assert result.problems == ["rmsnorm", "softmax"] and result.kinds == ["h100", "h200"]


def test_the_queue_sorts_by_speedup_and_age(mixed):
    by_speedup = [mixed["softmax_h200"], mixed["softmax_h100"], mixed["rmsnorm_h200"]]
    assert queued(sort="speedup") == by_speedup
    assert queued(sort="-speedup") == by_speedup[::-1]
    assert queued(sort="age") == by_speedup  # newest first; here also fastest first
    assert queued(sort="-age") == by_speedup[::-1]
    assert queued(sort="problem")[0] == mixed["rmsnorm_h200"]
    assert queued(sort="nonsense") == by_speedup


def test_counts_per_reviewer(mixed, reviewer, django_user_model):
    from core.roles import REVIEWERS
    from tests.web.conftest import _user

    other = _user(django_user_model, "linus", REVIEWERS)
    trials = {k: Trial.objects.get(pk=v) for k, v in mixed.items()}
    services.decide(trial=trials["softmax_h200"], user=reviewer, action="veto", text="no")
    services.decide(trial=trials["softmax_h100"], user=reviewer, action="send_back", text="try X")
    services.decide(trial=trials["rmsnorm_h200"], user=other, action="veto", text="no")
    counts = {row["reviewer"]: row for row in selectors.reviewer_counts()}
    assert counts["grace"]["total"] == 2
    assert counts["grace"]["vetoed"] == 1 and counts["grace"]["sent_back"] == 1
    assert counts["linus"]["total"] == 1 and counts["linus"]["approved"] == 0
    assert Review.objects.count() == 3
