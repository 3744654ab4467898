"""An LLM search end to end with real processes: the orchestrator (`manage.py orchestrator`),
an `interpret` GPU worker, real Redis, and the local OpenAI-compatible server replaying real
Triton candidates (good, wrong, malformed, hacked)."""

from __future__ import annotations

import time

import pytest

from searches.models import Search, Trial
from tests.web.agent_helpers import GOOD, HACKED, MALFORMED, WRONG, fenced
from tests.web.domain import queue_search
from tests.web.openai_server import OpenAIServer, Step

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def server(env):
    """The OpenAI-compatible endpoint the processes' agent talks to."""
    with OpenAIServer() as server:
        env["procs"].env.update(
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-e2e-secret-key-000000",
            AUTOWEB_LLM_TUNE_TRIALS="1",
            AUTOWEB_LLM_BACKOFF_MS="10",
        )
        yield server
        env["procs"].stop_all()  # before the endpoint goes


def test_an_llm_search_keeps_tunes_reverts_and_fails_with_the_right_categories(
    env, server, engineer
):
    server.script.add(
        Step(status=429, message="slow down", retry_after=0.1),  # retried, then:
        Step(reply=fenced(GOOD), chunk_chars=64),  # kept; then its knobs tuned once
        Step(reply=fenced(WRONG)),  # incorrect, on the worker
        Step(reply=MALFORMED),  # malformed, no worker needed
        Step(reply=fenced(HACKED)),  # prohibited by the static checks
    )
    search = queue_search(
        engineer,
        start={"seed": 1},
        proposer="llm:model-a",
        target_kinds=["interpret"],
        max_trials=5,
        context_packs=["deepseek-mla-sparse"],
    )
    env["start"]("-m", "kernels.worker", "--device", "interpret", "--name", "e2e:llm")
    env["start"]("manage.py", "orchestrator")
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        search.refresh_from_db()
        if not search.is_active:
            break
        time.sleep(0.5)
    trials = list(search.trials.order_by("index"))
    states = [(t.index, t.proposer, t.status, t.failure, t.reason[:80]) for t in trials]
    assert search.status == Search.Status.FINISHED, (search.stop_reason, states)
    assert search.stop_reason.startswith("budget: trials"), search.stop_reason
    assert [(t.proposer, t.status, t.failure) for t in trials] == [
        ("llm:model-a", Trial.Status.KEPT, None),
        ("tuner", Trial.Status.REVERTED, None),
        ("llm:model-a", Trial.Status.FAILED, "incorrect"),
        ("llm:model-a", Trial.Status.FAILED, "malformed"),
        ("llm:model-a", Trial.Status.FAILED, "prohibited"),
    ], states
    assert trials[1].parent_id == trials[0].pk and trials[1].knob_values["BLOCK_N"] == 512
    assert all(t.prompt and t.tokens_in for t in trials if t.proposer != "tuner")
    assert "kv_lora_rank" in trials[0].prompt
    # The fourth prompt heard about the wrong candidate's failure.
    assert "failed (incorrect)" in trials[3].prompt
    assert search.tokens == sum((t.tokens_in or 0) + (t.tokens_out or 0) for t in trials)
    assert len(server.requests) == 5  # one 429, then four replies
