"""One LLM step in the orchestrator loop, with the local OpenAI-compatible server: trials
recorded with their prompt, model and tokens; malformed replies; fatal errors stop the search;
the token budget; switching models; hybrid tuning; tokens streamed to the search's group."""

from __future__ import annotations

import json
import os
import re

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from core.errors import DomainError
from searches import live, services
from searches.agent import notes, step
from searches.agent.switch import set_llm
from searches.models import Search, Trial
from tests.conftest import test_redis_url
from tests.web.agent_helpers import (
    GOOD,
    HACKED,
    MALFORMED,
    TWO_FILES,
    WRONG,
    WRONG_SIGNATURE,
    fenced,
    llm_search,
)
from tests.web.domain import interpreted, judge, rejected
from tests.web.openai_server import Step

pytestmark = pytest.mark.django_db


def _fill(search: Search, capacity: int = 1) -> list[Trial]:
    queued: list[Trial] = []
    step.fill(
        Search.objects.get(pk=search.pk), "interpret", capacity=capacity, enqueue=queued.append
    )
    return queued


def test_a_proposal_is_recorded_with_its_model_prompt_tokens_and_cost(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD), prompt_tokens=1200, completion_tokens=300))
    search = llm_search(engineer)
    [trial] = _fill(search)
    assert trial.status == Trial.Status.PROPOSED and trial.index == 1
    assert trial.proposer == "llm:model-a" and trial.model == "model-a"
    assert trial.source == GOOD.rstrip() + "\n"
    assert trial.knob_values == {"BLOCK_N": 1024, "NUM_WARPS": 4}
    assert (trial.tokens_in, trial.tokens_out) == (1200, 300)
    trial.refresh_from_db()
    assert trial.cost_usd == pytest.approx((1200 * 1.0 + 300 * 2.0) / 1e6)
    assert "Keeps the row in registers" in trial.rationale
    assert trial.prompt.startswith("### system") and "kv_lora_rank" in trial.prompt
    assert "Triton CPU interpreter" in trial.prompt  # the interpret kind's hardware pack
    search.refresh_from_db()
    assert search.tokens == 1500 and search.cost_usd == pytest.approx(trial.cost_usd)
    sent = llm_server.requests[0]["messages"]
    assert trial.prompt == f"### system\n\n{sent[0]['content']}\n\n### user\n\n{sent[1]['content']}"


@pytest.mark.parametrize(
    ("reply", "failure", "reason"),
    [
        (MALFORMED, "malformed", "no fenced python code block"),
        (TWO_FILES, "malformed", "2 python code blocks"),
        (fenced(WRONG_SIGNATURE), "malformed", "does not match the problem's"),
        (fenced(HACKED), "prohibited", "elapsed_time"),
    ],
)
def test_an_unusable_reply_fails_its_trial_and_the_loop_goes_on(
    engineer, llm_server, reply, failure, reason
):
    llm_server.script.add(Step(reply=reply), Step(reply=fenced(GOOD)))
    search = llm_search(engineer)
    assert _fill(search) == []
    bad = search.trials.get(index=1)
    assert bad.status == Trial.Status.FAILED and bad.failure == failure
    assert reason in bad.reason and bad.tokens_out and bad.prompt
    search.refresh_from_db()
    assert search.status == Search.Status.RUNNING and search.trials_failed == 1
    [good] = _fill(search)  # the next step asks again, and hears why the last one failed
    assert good.index == 2 and good.status == Trial.Status.PROPOSED
    user = llm_server.requests[1]["messages"][1]["content"]
    # The model's own knob values follow its name (as the tuner's do), when it kept any.
    assert re.search(rf"trial 1 by model-a( \[[^\]\n]*\])?: failed \({failure}\)", user)


def test_a_repeated_source_is_malformed_not_evaluated_twice(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD)))
    search = llm_search(engineer)
    [first] = _fill(search)
    judge(first, rejected("incorrect"))
    assert _fill(search) == []
    again = search.trials.get(index=2)
    assert again.failure == "malformed" and "repeats trial 1's source" in again.reason


@pytest.mark.parametrize(
    ("step_", "message"),
    [
        (Step(status=401, message="Incorrect API key provided"), "refused the API key (401)"),
        (Step(reply="x", models=("someone-else",)), "model 'model-a' or the endpoint"),
        (Step(status=500, message="down"), "gave no reply after 3 attempts"),
    ],
)
def test_a_bad_key_an_unknown_model_or_a_dead_endpoint_stops_the_search(
    engineer, llm_server, step_, message
):
    llm_server.script.add(step_)
    search = llm_search(engineer)
    assert _fill(search) == []
    search.refresh_from_db()
    assert search.status == Search.Status.FAILED and message in search.stop_reason
    assert "sk-test-secret" not in search.stop_reason
    assert search.trials.count() == 0


def test_the_token_budget_stops_the_search_cleanly(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD), prompt_tokens=3000, completion_tokens=1000))
    search = llm_search(engineer, max_tokens=6000)
    [trial] = _fill(search)
    assert llm_server.requests[0]["max_tokens"] <= 6000
    judge(trial, rejected("incorrect"))
    search.refresh_from_db()
    assert services.check_budget(search=search) is None  # 4000 of 6000
    # 5500 used: the next prompt alone does not fit in what is left, so no call is made.
    Search.objects.filter(pk=search.pk).update(tokens=5500)
    assert _fill(search) == [] and len(llm_server.requests) == 1
    search.refresh_from_db()
    assert search.status == Search.Status.STOPPING
    assert search.stop_reason.startswith("budget: tokens")


def test_switching_the_model_mid_search_takes_effect_at_the_next_proposal(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD)), Step(reply=fenced(WRONG)))
    search = llm_search(engineer)
    [first] = _fill(search)
    judge(first, rejected("incorrect"))
    set_llm(search=search, user=engineer, model="model-b", api_key="sk-other-key-987654321")
    [second] = _fill(search)
    assert (first.model, second.model) == ("model-a", "model-b")
    assert second.proposer == "llm:model-b"
    assert [r["model"] for r in llm_server.requests] == ["model-a", "model-b"]
    assert llm_server.requests[1]["_authorization"] == "Bearer sk-other-key-987654321"
    with pytest.raises(DomainError, match="not a model name"):
        set_llm(search=search, user=engineer, model="bad model name")
    search.refresh_from_db()
    assert search.model == "model-b"  # the bad input changed nothing


def test_an_accepted_candidate_with_knobs_is_tuned_before_the_next_llm_step(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD)), Step(reply=fenced(WRONG)))
    search = llm_search(engineer)
    [llm_trial] = _fill(search)
    assert _fill(search) == []  # in flight: nothing more until its verdict
    judge(llm_trial, interpreted())
    [tuned] = _fill(search, capacity=4)  # the space is {512, 1024} x {4}: one configuration left
    assert tuned.proposer == "tuner" and tuned.parent_id == llm_trial.pk
    assert tuned.knob_values == {"BLOCK_N": 512, "NUM_WARPS": 4}
    assert "BLOCK_N = 512" in tuned.source and "tuning trial 1's knobs" in tuned.rationale
    assert len(llm_server.requests) == 1  # the model waits for the tuner
    judge(tuned, interpreted())
    [next_llm] = _fill(search)
    assert next_llm.proposer == "llm:model-a" and len(llm_server.requests) == 2


def test_a_failed_candidate_is_not_tuned(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD)), Step(reply=fenced(WRONG)))
    search = llm_search(engineer)
    [llm_trial] = _fill(search)
    judge(llm_trial, rejected("incorrect"))
    [second] = _fill(search)
    assert second.proposer == "llm:model-a"


def test_reviewer_notes_reach_the_next_prompt(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD)), Step(reply=fenced(WRONG)))
    search = llm_search(engineer)
    [first] = _fill(search)
    judge(first, rejected("incorrect"))
    notes.add_note(search=search, trial=first, kind="veto", text="Tested only small rows.")
    _fill(search)
    assert "VETO: Tested only small rows." in llm_server.requests[1]["messages"][1]["content"]
    with pytest.raises(DomainError):
        notes.add_note(search=search, text="   ")


@pytest.mark.django_db(transaction=True)
def test_tokens_stream_to_the_search_group_as_the_model_writes(engineer, llm_server, settings):
    url = test_redis_url(7)
    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError:
        pytest.skip(f"no Redis on {url}")
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [url], "prefix": f"agent-test-{os.getpid()}"},
        }
    }
    llm_server.script.add(Step(reply=fenced(GOOD), chunk_chars=16, chunk_delay_s=0.002))
    search = llm_search(engineer)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(live.group_name(search.pk), channel)
    _fill(search)
    texts = []
    while True:
        try:
            message = async_to_sync(_receive)(layer, channel)
        except TimeoutError:
            break
        if message.get("kind") == "tokens":
            texts.append(message["text"])
    streamed = "".join(texts)
    assert "model-a: proposal 1" in streamed
    assert GOOD.rstrip() in streamed  # every token arrived, in order
    assert 2 <= len(texts) < len(GOOD) // 16  # batched: fewer messages than chunks
    json.dumps(texts)


async def _receive(layer, channel):
    import asyncio

    return await asyncio.wait_for(layer.receive(channel), timeout=1.0)


def test_stopping_the_search_ends_a_reply_being_written(engineer, llm_server, monkeypatch):
    monkeypatch.setattr(step, "STOP_CHECK_S", 0.0)
    monkeypatch.setattr(step, "record", lambda *a, **k: pytest.fail("the reply ran to its end"))
    llm_server.script.add(Step(reply=fenced(GOOD), chunk_chars=8, chunk_delay_s=0.01))
    search = llm_search(engineer)
    services.stop_search(search=search, user=engineer)  # as if clicked while the model writes
    assert step.propose(search, "interpret", enqueue=lambda t: None) is None
    search.refresh_from_db()
    assert search.trials.count() == 0 and search.tokens > 0  # the spent tokens still count


def test_keeping_the_lease_renews_it_at_once():
    renewals: list[int] = []
    with step.keep_lease(lambda: renewals.append(1) or True) as lost:
        assert renewals == [1] and not lost.is_set()  # before the thread's first interval
    with step.keep_lease(lambda: False) as lost:
        assert lost.is_set()


def test_a_lease_lost_while_the_prompt_was_built_asks_the_model_nothing(engineer, llm_server):
    # On a loaded machine building the prompt outlasted the lease; the model was asked anyway
    # and its reply thrown away at the first renewal, so the next loop met the endpoint's next
    # (failing) reply instead.
    llm_server.script.add(Step(reply=fenced(GOOD)))
    search = llm_search(engineer)
    assert step.propose(search, "interpret", enqueue=lambda t: None, renew=lambda: False) is None
    assert llm_server.requests == []
    search.refresh_from_db()
    assert search.trials.count() == 0 and search.tokens == 0 and search.is_active
    # the next loop, holding the lease, gets the reply that waited
    [trial] = _fill(search)
    assert trial.source == GOOD.rstrip() + "\n"
