"""Approval to release with real processes: the orchestrator (`manage.py orchestrator`, which
watches re-validation jobs), a GPU worker of kind `interpret` (`python -m kernels.worker`), real
Redis and the test database."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from library import services
from library.models import Release, Revalidation, Review
from searches import services as search_services
from tests.library.helpers import HONEST_SOFTMAX, WRONG_OUTSIDE_SMOKE, candidate
from tests.web.domain import idea_kwargs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _approve(source: str, engineer, reviewer):
    idea = search_services.create_idea(**idea_kwargs(engineer, target_kinds=["interpret"]))
    search = search_services.begin_search(
        search=search_services.start_search(idea=idea, user=engineer, seed=1)
    )
    trial = candidate(search, source)
    with transaction.atomic():
        return services.decide(
            trial=trial,
            user=reviewer,
            action="approve",
            shape_range={"M": [1, 64], "N": [1, 32768]},
            text="ship it",
        )


def test_approval_revalidates_on_the_worker_and_only_the_passing_kernel_is_released(
    env,
    settings,
):
    settings.REDIS_URL = env["url"]
    users = get_user_model().objects
    engineer = users.create_user("eng", password="pw")
    search_services.grant_role(user=engineer, role="engineers")
    reviewer = users.create_user("rev", password="pw")
    search_services.grant_role(user=reviewer, role="reviewers")

    good = _approve(HONEST_SOFTMAX, engineer, reviewer)
    bad = _approve(WRONG_OUTSIDE_SMOKE, engineer, reviewer)
    env["start"]("-m", "kernels.worker", "--device", "interpret", "--name", "e2e:reval")
    env["start"]("manage.py", "orchestrator")

    deadline = time.monotonic() + 300
    while Revalidation.objects.filter(status=Revalidation.Status.QUEUED).exists():
        assert time.monotonic() < deadline, list(Revalidation.objects.values("kind", "status"))
        time.sleep(0.5)

    good_reval = Review.objects.get(pk=good.pk).revalidations.get()
    assert good_reval.status == "passed", good_reval.reasons
    assert good_reval.report["checks"]["end_to_end"]["passed"] is True
    assert "M=1,N=4096" in good_reval.report["revalidation"]["shapes"]
    release = Release.objects.get()
    assert release.trial_id == good.trial_id and release.kind == "interpret"
    assert release.shape_range == {"M": [1, 64], "N": [1, 32768]}

    bad_reval = Review.objects.get(pk=bad.pk).revalidations.get()
    assert bad_reval.status == "failed"
    assert any("N=4096" in r for r in bad_reval.reasons), bad_reval.reasons
    assert Review.objects.get(pk=bad.pk).outcome == "rejected by re-validation"
