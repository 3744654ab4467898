"""An LLM endpoint outage with real processes: the orchestrator (`manage.py orchestrator`), an
`interpret` worker, real Redis, and the local OpenAI-compatible server made to fail for a while
and then recover. An outage shorter than the retry window (AUTOWEB_LLM_RETRY_S, short here) is
survived; a longer one fails the search with every distinct cause, logged without the key; the
failed search resumes from its history once the endpoint is back."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from searches.models import Search, Trial
from tests.web.agent_helpers import GOOD, fenced
from tests.web.domain import queue_search
from tests.web.openai_server import OpenAIServer, Step
from tests.web.processes import Processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Not shaped like a key: only redaction by the key's own value keeps it out of the logs.
KEY = "plain-secret-value-4711"
WINDOW_S = 6


@pytest.fixture
def server(env):
    """The OpenAI-compatible endpoint the processes' agent talks to, with a short retry window."""
    with OpenAIServer() as server:
        env["procs"].env.update(
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY=KEY,
            AUTOWEB_LLM_TUNE_TRIALS="0",
            AUTOWEB_LLM_RETRY_S=str(WINDOW_S),
            AUTOWEB_LLM_BACKOFF_MS="250",
        )
        yield server
        env["procs"].stop_all()  # before the endpoint goes


def _wait(search: Search, until, timeout: float, procs: Processes) -> Search:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        search.refresh_from_db()
        if until(search):
            return search
        time.sleep(0.3)
    states = [(t.index, t.status, t.reason[:80]) for t in search.trials.order_by("index")]
    raise AssertionError(
        f"search {search.status} ({search.stop_reason}); trials {states}\n" + procs.log_tails()
    )


def test_an_outage_is_survived_a_longer_one_fails_the_search_and_resume_carries_on(
    env, server, engineer, client
):
    procs = env["procs"]
    # Echoed by a misbehaving proxy in its error bodies: still never logged nor shown.
    overloaded = Step(status=503, message=f"overloaded (upstream refused key {KEY})")
    bad_gateway = Step(status=502, message="bad gateway")
    server.script.add(Step(reply=fenced(GOOD)))
    server.script.outage(600, overloaded, bad_gateway)
    search = queue_search(
        engineer,
        start={"seed": 1},
        proposer="llm:model-a",
        target_kinds=["interpret"],
        max_trials=2,
    )
    procs.start("-m", "kernels.worker", "--device", "interpret", "--name", "outage:cpu")
    procs.start("manage.py", "orchestrator")

    # 1. Down for a while (three failed attempts, within the window): then back. The
    # proposal waits it out and the search carries on.
    deadline = time.monotonic() + 120
    while server.script.down_hits < 3:
        assert time.monotonic() < deadline, procs.log_tails()
        time.sleep(0.05)
    # After the one good reply the endpoint errs again, so the next proposal cannot slip in
    # before step 2 starts its outage (the last scripted step repeats).
    server.script.add(overloaded, bad_gateway, overloaded)
    server.script.outage(0)
    search = _wait(search, lambda s: s.trials.filter(status=Trial.Status.KEPT).exists(), 300, procs)
    assert search.status == Search.Status.RUNNING
    first = search.trials.get()
    assert first.proposer == "llm:model-a"

    # 2. Down for longer than the window: the next proposal gives up and the search fails,
    # naming each distinct cause once.
    server.script.outage(600, overloaded, bad_gateway)
    search = _wait(search, lambda s: s.status == Search.Status.FAILED, 120, procs)
    reason = search.stop_reason
    assert "503: overloaded" in reason and "502: bad gateway" in reason, reason
    assert reason.count("502: bad gateway") == 1, reason
    assert f"retry window {WINDOW_S} s" in reason, reason
    assert KEY not in reason

    # Every search-ending error reaches the orchestrator's log in one line; the key never does.
    logs = "".join(p.read_text() for p in procs.logs.glob("proc*.log"))
    failed = [line for line in logs.splitlines() if f"search {search.pk} failed:" in line]
    assert len(failed) == 1 and "503: overloaded" in failed[0], failed
    assert KEY not in logs

    # 3. The endpoint is back: Resume (the page's POST) continues from the history.
    server.script.outage(0)
    server.script.add(Step(reply=fenced(GOOD.replace("keep two passes", "two passes, again"))))
    client.force_login(engineer)
    response = client.post(reverse("searches:search_resume", args=[search.pk]))
    assert response.status_code == 302
    search = _wait(search, lambda s: not s.is_active, 300, procs)
    assert search.status == Search.Status.FINISHED, search.stop_reason
    assert search.stop_reason.startswith("budget: trials"), search.stop_reason
    trials = list(search.trials.order_by("index"))
    assert [t.pk for t in trials][:1] == [first.pk]  # its history stayed
    assert [(t.proposer, t.terminal) for t in trials] == [("llm:model-a", True)] * 2
    assert search.incumbent_id is not None
    assert KEY not in "".join(p.read_text() for p in procs.logs.glob("proc*.log"))
