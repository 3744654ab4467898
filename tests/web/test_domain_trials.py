from __future__ import annotations

import math
import threading

import pytest
from django.db import connection

from core.errors import DomainError, DuplicateCandidate, IllegalTransition, InvalidReport
from searches import services
from searches.models import Search, Trial
from tests.web.domain import (
    accepted,
    confirmed,
    idea_kwargs,
    interpreted,
    judge,
    propose,
    rejected,
    variant,
)

pytestmark = pytest.mark.django_db

T = Trial.Status


def _search() -> Search:
    return Search.objects.get()


# -- proposals --------------------------------------------------------------------------------


def test_a_proposal_is_numbered_and_counted(search):
    first = propose(search, 1)
    second = services.record_proposal(
        search=search,
        source=variant(2),
        parent=first,
        proposer="llm:gpt-4o",
        model="gpt-4o",
        rationale="halve BLOCK_N for short rows",
        knob_values={"BLOCK_N": 512},
        prompt="You are a kernel engineer...",
        tokens_in=1200,
        tokens_out=300,
    )
    rows = list(Trial.objects.order_by("index"))
    assert [(t.index, t.status) for t in rows] == [(1, T.PROPOSED), (2, T.PROPOSED)]
    stored = rows[1]
    assert stored.pk == second.pk and stored.parent == first
    assert (stored.proposer, stored.model, stored.knob_values) == (
        "llm:gpt-4o",
        "gpt-4o",
        {"BLOCK_N": 512},
    )
    assert (stored.tokens_in, stored.tokens_out, stored.prompt) == (
        1200,
        300,
        "You are a kernel engineer...",
    )
    assert len(stored.source_sha256) == 64 and stored.source == variant(2)
    assert stored.terminal is False
    assert (_search().trials_total, _search().tokens) == (2, 1500)


def test_the_same_source_twice_in_a_search_is_refused(search):
    first = propose(search, 1)
    with pytest.raises(
        DuplicateCandidate, match=f"already tried this exact source as trial {first.index}"
    ):
        propose(search, 1)
    assert Trial.objects.count() == 1
    assert _search().trials_total == 1


def test_the_same_source_may_be_tried_in_another_search(search, idea, engineer):
    other = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    propose(search, 1)
    propose(other, 1)
    assert Trial.objects.count() == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"source": ""}, "source"),
        ({"source": "  \n"}, "source"),
        ({"source": "def kernel(x):\x00\n"}, "source"),
        ({"source": "#" * (256 * 1024 + 1)}, "source"),
        ({"proposer": ""}, "proposer"),
        ({"model": "bad model"}, "model"),
        ({"knob_values": [1, 2]}, "knob_values"),
        ({"tokens_in": -1}, "tokens_in"),
        ({"tokens_out": "many"}, "tokens_out"),
        ({"rationale": None, "prompt": "a\x00"}, "prompt"),
    ],
)
def test_a_bad_proposal_is_refused_and_nothing_saved(search, overrides, field):
    kwargs = {"search": search, "source": variant(1), "parent": None, "proposer": "tuner"}
    kwargs.update(overrides)
    with pytest.raises(DomainError) as caught:
        services.record_proposal(**kwargs)
    assert field in caught.value.message_dict
    assert Trial.objects.count() == 0
    assert _search().trials_total == 0


def test_a_parent_from_another_search_is_refused(search, idea, engineer):
    other = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    foreign = propose(other, 1)
    with pytest.raises(DomainError, match="belongs to another search"):
        propose(search, 2, parent=foreign)
    assert Trial.objects.filter(search=search).count() == 0


@pytest.mark.parametrize(
    "status",
    [Search.Status.QUEUED, Search.Status.STOPPING, Search.Status.FINISHED, Search.Status.FAILED],
)
def test_only_a_running_or_paused_search_takes_proposals(search, status):
    Search.objects.filter(pk=search.pk).update(status=status)
    with pytest.raises(DomainError, match=f"is {status}: it takes no new trials"):
        propose(search, 1)
    assert Trial.objects.count() == 0


def test_a_paused_search_still_records_a_proposal_already_written(search, engineer):
    services.pause_search(search=search, user=engineer)
    assert propose(search, 1).status == T.PROPOSED


def test_a_proposal_past_the_trial_budget_is_refused(engineer):
    idea = services.create_idea(**idea_kwargs(engineer, max_trials=2))
    search = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    propose(search, 1)
    propose(search, 2)
    with pytest.raises(DomainError, match="used its budget of 2 trials"):
        propose(search, 3)
    assert Trial.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_proposals_get_distinct_consecutive_indexes(engineer):
    idea = services.create_idea(**idea_kwargs(engineer))
    search = services.begin_search(search=services.start_search(idea=idea, user=engineer))
    barrier = threading.Barrier(2)
    errors: list[Exception] = []

    def orchestrator(offset: int) -> None:
        try:
            barrier.wait(timeout=10)
            for i in range(10):
                propose(search, offset + i)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=orchestrator, args=(k * 100,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(Trial.objects.values_list("index", flat=True)) == list(range(1, 21))
    assert _search().trials_total == 20


# -- queue and progress -----------------------------------------------------------------------


def test_queueing_records_the_job_and_counts_the_attempt(search):
    trial = propose(search, 1)
    services.mark_trial_queued(trial=trial, job_id="job-1")
    stored = Trial.objects.get()
    assert (stored.status, stored.job_id, stored.attempts) == (T.QUEUED, "job-1", 1)
    assert stored.queued_at is not None


def test_queueing_again_with_the_same_job_changes_nothing(search):
    trial = propose(search, 1)
    services.mark_trial_queued(trial=trial, job_id="job-1")
    services.mark_trial_phase(trial=trial, phase="compiling")
    services.mark_trial_queued(trial=trial, job_id="job-1")
    stored = Trial.objects.get()
    assert (stored.status, stored.attempts) == (T.COMPILING, 1)


def test_a_lost_job_is_requeued_under_a_new_id(search):
    trial = propose(search, 1)
    services.mark_trial_queued(trial=trial, job_id="job-1")
    services.mark_trial_phase(trial=trial, phase="verifying")
    services.mark_trial_queued(trial=trial, job_id="job-2")
    stored = Trial.objects.get()
    assert (stored.status, stored.job_id, stored.attempts, stored.started_at) == (
        T.QUEUED,
        "job-2",
        2,
        None,
    )


def test_a_judged_trial_cannot_be_queued(search):
    trial = judge(propose(search, 1), accepted())
    with pytest.raises(IllegalTransition, match="is kept: it cannot be queued again"):
        services.mark_trial_queued(trial=trial, job_id="job-9")
    assert Trial.objects.get().job_id is None


def test_one_job_id_cannot_run_two_trials(search):
    services.mark_trial_queued(trial=propose(search, 1), job_id="job-1")
    second = propose(search, 2)
    with pytest.raises(DomainError, match="already runs another trial"):
        services.mark_trial_queued(trial=second, job_id="job-1")
    assert Trial.objects.get(pk=second.pk).status == T.PROPOSED


@pytest.mark.parametrize("job_id", ["", "  ", "j" * 101, None])
def test_a_bad_job_id_is_refused(search, job_id):
    trial = propose(search, 1)
    with pytest.raises(DomainError, match="job id"):
        services.mark_trial_queued(trial=trial, job_id=job_id)
    assert Trial.objects.get().status == T.PROPOSED


def test_phases_move_forwards_only_and_repeat_harmlessly(search):
    trial = propose(search, 1)
    services.mark_trial_queued(trial=trial, job_id="job-1")
    seen = []
    for phase in ["compiling", "compiling", "benchmarking", "verifying", "compiling"]:
        seen.append(services.mark_trial_phase(trial=trial, phase=phase).status)
    assert seen == [T.COMPILING, T.COMPILING, T.BENCHMARKING, T.BENCHMARKING, T.BENCHMARKING]
    stored = Trial.objects.get()
    assert stored.status == T.BENCHMARKING and stored.started_at is not None


def test_progress_after_the_verdict_is_ignored(search):
    trial = judge(propose(search, 1), accepted())
    services.mark_trial_phase(trial=trial, phase="benchmarking")
    assert Trial.objects.get().status == T.KEPT


@pytest.mark.parametrize("phase", ["kept", "queued", "done", ""])
def test_an_unknown_phase_is_refused(search, phase):
    trial = propose(search, 1)
    with pytest.raises(DomainError, match="is not a phase"):
        services.mark_trial_phase(trial=trial, phase=phase)
    assert Trial.objects.get().status == T.PROPOSED


# -- verdicts ---------------------------------------------------------------------------------


def test_the_first_accepted_trial_becomes_the_incumbent(search):
    trial = judge(propose(search, 1), accepted(ms=0.5), gpu_seconds=3.5)
    stored = Trial.objects.get()
    assert stored.pk == trial.pk
    assert (stored.status, stored.failure) == (T.KEPT, None)
    assert stored.reasons == ["first correct candidate: the starting incumbent"]
    assert (stored.geomean_ms, stored.noise) == (0.5, 0.01)
    assert math.isclose(stored.speedup_eager, 1.2) and math.isclose(stored.speedup_compiled, 1.1)
    assert (stored.device_kind, stored.device_name) == ("h200", "NVIDIA H200")
    assert stored.versions == {"torch": "2.11.0", "triton": "3.6.0"}
    assert stored.report["verdict"] == "accepted"
    assert stored.finished_at is not None and stored.gpu_seconds == 3.5
    s = _search()
    assert (s.incumbent_id, s.trials_kept, s.trials_failed, s.gpu_seconds) == (trial.pk, 1, 0, 3.5)


def test_a_trial_faster_beyond_noise_waits_for_confirmation_before_it_is_kept(search):
    incumbent = judge(propose(search, 1), accepted(ms=0.50, noise=0.01))
    faster = judge(propose(search, 2), accepted(ms=0.40, noise=0.01), confirm=False)
    assert faster.status == T.CONFIRMING and not faster.terminal
    assert faster.reason == (
        "0.4 ms vs incumbent 0.5 ms (noise 2.0%): faster beyond noise, to be confirmed"
    )
    assert faster.confirmation == {
        "against": incumbent.pk,
        "against_index": 1,
        "screened": faster.reason,
    }
    assert (_search().incumbent_id, _search().trials_kept) == (incumbent.pk, 1)

    kept = confirmed(
        faster, [{"geomean_ms": 0.5, "noise": 0.005}, {"geomean_ms": 0.41, "noise": 0.005}]
    )

    assert kept.status == T.KEPT
    assert kept.reason == (
        "0.4 ms vs incumbent 0.5 ms (noise 2.0%): faster beyond noise; "
        "re-timed interleaved: 0.41 ms vs 0.5 ms: confirmed"
    )
    assert kept.confirmation["retimed"]["challenger"]["geomean_ms"] == 0.41
    s = _search()
    assert (s.incumbent_id, s.trials_kept, s.trials_since_improvement) == (kept.pk, 2, 0)


def test_a_screening_win_the_retime_does_not_confirm_is_reverted(search):
    incumbent = judge(propose(search, 1), accepted(ms=0.50, noise=0.01))
    faster = judge(propose(search, 2), accepted(ms=0.40, noise=0.01), confirm=False)

    refuted = confirmed(
        faster, [{"geomean_ms": 0.45, "noise": 0.01}, {"geomean_ms": 0.445, "noise": 0.01}]
    )

    assert refuted.status == T.REVERTED
    assert refuted.reason.endswith("re-timed interleaved: 0.445 ms vs 0.45 ms: not confirmed")
    s = _search()
    assert (s.incumbent_id, s.trials_kept, s.trials_since_improvement) == (incumbent.pk, 1, 1)


def test_a_lost_or_failed_retime_reverts_the_win(search):
    judge(propose(search, 1), accepted(ms=0.50))
    faster = judge(propose(search, 2), accepted(ms=0.40), confirm=False)

    reverted = services.record_confirmation(trial=faster, report={"error": "no such problem"})

    assert reverted.status == T.REVERTED
    assert reverted.reason.endswith("; re-time failed: no such problem")


def test_a_win_confirmed_against_an_incumbent_since_replaced_is_screened_again(search):
    judge(propose(search, 1), accepted(ms=0.50))
    slower_win = judge(propose(search, 2), accepted(ms=0.45), confirm=False)
    better = judge(propose(search, 3), accepted(ms=0.30), confirm=False)
    # trial 3 is confirmed first (say trial 2's re-time was lost and re-run)
    better = confirmed(better)
    assert better.status == T.KEPT

    # trial 2's re-time against trial 1 arrives: it no longer says anything about trial 3
    after = confirmed(
        slower_win, [{"geomean_ms": 0.50, "noise": 0.01}, {"geomean_ms": 0.45, "noise": 0.01}]
    )

    assert after.status == T.REVERTED
    assert after.reason == "0.45 ms vs incumbent 0.3 ms (noise 2.0%): not faster beyond noise"
    assert _search().incumbent_id == better.pk


def test_recording_a_confirming_trial_again_changes_nothing(search):
    judge(propose(search, 1), accepted(ms=0.50))
    trial = judge(propose(search, 2), accepted(ms=0.40), confirm=False)

    again = judge(trial, rejected("crashed"), confirm=False)

    assert again.status == T.CONFIRMING and again.failure is None


@pytest.mark.parametrize(("ms", "noise"), [(0.495, 0.01), (0.49, 0.02), (0.6, 0.01), (0.5, 0.0)])
def test_a_trial_not_faster_beyond_noise_is_reverted(search, ms, noise):
    incumbent = judge(propose(search, 1), accepted(ms=0.50, noise=0.01))
    trial = judge(propose(search, 2), accepted(ms=ms, noise=noise))
    assert trial.status == T.REVERTED
    assert trial.reason.endswith("not faster beyond noise")
    s = _search()
    assert (s.incumbent_id, s.trials_kept, s.trials_since_improvement) == (incumbent.pk, 1, 1)


def test_a_rejected_report_fails_the_trial_with_its_category(search):
    judge(propose(search, 1), accepted())
    trial = judge(propose(search, 2), rejected("hack_suspected", "faster than the roofline allows"))
    stored = Trial.objects.get(pk=trial.pk)
    assert (stored.status, stored.failure) == (T.FAILED, "hack_suspected")
    assert stored.reasons == ["faster than the roofline allows"]
    s = _search()
    assert (s.trials_failed, s.trials_kept, s.trials_since_improvement) == (1, 1, 1)


def test_recording_a_result_twice_counts_it_once(search):
    trial = propose(search, 1)
    first = judge(trial, accepted(ms=0.5), gpu_seconds=4.0)
    again = judge(trial, rejected("crashed"), gpu_seconds=4.0)
    assert again.status == first.status == T.KEPT
    assert again.reasons == first.reasons
    stored = Trial.objects.get()
    assert (stored.status, stored.failure, stored.gpu_seconds) == (T.KEPT, None, 4.0)
    s = _search()
    assert (s.trials_kept, s.trials_failed, s.gpu_seconds) == (1, 0, 4.0)


def test_a_failed_trial_recorded_twice_is_counted_once(search):
    trial = propose(search, 1)
    judge(trial, rejected("timeout"))
    judge(trial, rejected("timeout"))
    assert _search().trials_failed == 1


def test_on_the_interpreter_the_first_correct_trial_is_kept_and_later_ones_reverted(search):
    first = judge(propose(search, 1), interpreted())
    second = judge(propose(search, 2), interpreted())
    assert first.status == T.KEPT and first.geomean_ms is None
    assert first.device_kind == "interpret"
    assert second.status == T.REVERTED
    assert second.reasons == ["timings not meaningful on the interpreter"]
    assert _search().incumbent_id == first.pk


def test_a_timed_trial_replaces_an_untimed_incumbent(search):
    judge(propose(search, 1), interpreted())
    timed = judge(propose(search, 2), accepted(ms=0.5))
    assert timed.status == T.KEPT
    assert _search().incumbent_id == timed.pk


def test_timings_from_another_gpu_kind_are_not_compared(search):
    judge(propose(search, 1), accepted(ms=0.5, kind="h200"))
    other = judge(propose(search, 2), accepted(ms=0.1, kind="a100"))
    assert other.status == T.REVERTED
    assert "not comparable" in other.reason


def test_a_report_without_noise_cannot_win(search):
    judge(propose(search, 1), accepted(ms=0.5))
    trial = judge(propose(search, 2), accepted(ms=0.1, noise=None))
    assert trial.status == T.REVERTED and "noise not measured" in trial.reason


def test_non_finite_numbers_in_a_report_are_stored_as_text(search):
    report = rejected("incorrect")
    report["shapes"] = [{"max_abs_err": float("nan"), "ratio": float("inf"), "note": "a\x00b"}]
    report["summary"]["geomean_ms"] = float("nan")
    judge(propose(search, 1), report)
    stored = Trial.objects.get()
    assert stored.report["shapes"] == [
        {"max_abs_err": "NaN", "ratio": "Infinity", "note": "a\\x00b"}
    ]
    assert stored.geomean_ms is None


@pytest.mark.parametrize(
    ("report", "match"),
    [
        ([], "JSON object"),
        ({"verdict": "maybe"}, "verdict must be"),
        ({"verdict": "rejected", "failure": "sad"}, "names its failure"),
        ({"verdict": "rejected"}, "names its failure"),
        ({"verdict": "accepted", "failure": "incorrect"}, "has no failure"),
        ({"verdict": "accepted", "failure": None, "reasons": "nope"}, "list of strings"),
        ({"verdict": "accepted", "failure": None, "summary": [1]}, "summary is a JSON object"),
        ({"verdict": "accepted", "failure": None, "extra": object()}, "is not JSON"),
    ],
)
def test_a_malformed_report_is_refused_and_nothing_saved(search, report, match):
    trial = propose(search, 1)
    with pytest.raises(InvalidReport, match=match):
        judge(trial, report)
    assert Trial.objects.get().status == T.PROPOSED
    assert _search().gpu_seconds == 0


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), "3", True])
def test_bad_gpu_seconds_are_refused(search, seconds):
    trial = propose(search, 1)
    with pytest.raises(DomainError, match="GPU seconds"):
        judge(trial, accepted(), gpu_seconds=seconds)
    assert Trial.objects.get().status == T.PROPOSED


def test_screening_fails_a_prohibited_candidate_before_any_gpu(search):
    trial = services.record_proposal(
        search=search,
        source="import os\n\ndef kernel(x):\n    return x\n",
        parent=None,
        proposer="tuner",
    )
    screened = services.screen_trial(trial=trial)
    stored = Trial.objects.get()
    assert screened.status == stored.status == T.FAILED
    assert stored.failure == "prohibited"
    assert any("os" in reason for reason in stored.reasons)
    assert (_search().trials_failed, _search().gpu_seconds) == (1, 0)


def test_screening_passes_a_valid_candidate_unchanged(search):
    trial = services.screen_trial(trial=propose(search, 1))
    assert trial.status == T.PROPOSED and Trial.objects.get().status == T.PROPOSED


def test_a_trial_can_be_rejected_without_a_report(search):
    trial = propose(search, 1)
    services.reject_trial(trial=trial, failure="crashed", reasons=["worker lost the job 3 times"])
    stored = Trial.objects.get()
    assert (stored.status, stored.failure, stored.reasons) == (
        T.FAILED,
        "crashed",
        ["worker lost the job 3 times"],
    )


def test_a_trial_as_json_leaves_the_heavy_fields_out_unless_asked(search):
    trial = judge(propose(search, 1), accepted())
    brief, full = trial.to_dict(), trial.to_dict(full=True)
    assert brief["status"] == "kept" and brief["terminal"] is True and "source" not in brief
    assert full["source"] == variant(1) and full["report"]["verdict"] == "accepted"
