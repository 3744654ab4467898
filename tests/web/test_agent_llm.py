"""The real openai client against the local OpenAI-compatible server: streaming, usage,
retries with backoff, fatal errors, timeouts."""

from __future__ import annotations

import threading
import time

import pytest

from searches.agent import llm
from tests.web.openai_server import OpenAIServer, Step

KEY = "sk-test-secret-key-0123456789"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello " * 40}]


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def _call(server, limits=None, **kw):
    waits: list[float] = []
    deltas: list[str] = []
    retries: list[tuple[int, str, float]] = []
    done = llm.complete(
        llm.Endpoint(model="model-a", base_url=server.base_url, api_key=KEY),
        MESSAGES,
        limits=limits or llm.Limits(timeout_s=5, attempts=3, backoff_s=0.01, max_tokens=500),
        on_delta=deltas.append,
        on_retry=lambda *a: retries.append(a),
        sleep=waits.append,
        **kw,
    )
    return done, deltas, retries, waits


def test_a_streamed_reply_arrives_in_pieces_with_its_usage(server):
    server.script.add(
        Step(reply="x" * 100, chunk_chars=10, prompt_tokens=321, completion_tokens=55)
    )
    done, deltas, retries, _ = _call(server)
    assert done.text == "x" * 100 and len(deltas) == 10
    assert (done.tokens_in, done.tokens_out, done.usage_reported) == (321, 55, True)
    assert done.attempts == 1 and retries == []
    request = server.requests[0]
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    assert request["model"] == "model-a" and request["max_tokens"] == 500
    assert request["_authorization"] == f"Bearer {KEY}"


def test_without_usage_the_tokens_are_estimated(server):
    server.script.add(Step(reply="y" * 400, usage=False))
    done, *_ = _call(server)
    assert not done.usage_reported and done.tokens_out == 101 and done.tokens_in > 0


def test_rate_limits_and_server_errors_are_retried_with_backoff(server):
    server.script.add(
        Step(status=429, message="slow down", retry_after=0.5),
        Step(status=500, message="boom"),
        Step(reply="ok"),
    )
    done, _, retries, waits = _call(server)
    assert done.text == "ok" and done.attempts == 3 and len(server.requests) == 3
    assert waits == [0.5, 0.02]  # the server's Retry-After, then backoff * 2**1
    assert retries[0][1].startswith("429: slow down") and retries[1][1].startswith("500: boom")


def test_after_the_last_attempt_the_endpoint_is_unavailable(server):
    server.script.add(Step(status=503, message="overloaded"))
    with pytest.raises(llm.LLMUnavailable, match=r"after 3 attempts .*causes: 503: overloaded"):
        _call(server)
    assert len(server.requests) == 3


def test_an_outage_shorter_than_the_retry_window_is_survived(server):
    """Five failures over about a minute (five attempts used to end the search) are survived
    with a two-minute window: the sixth attempt gets the reply."""
    server.script.add(*[Step(status=503, message="down")] * 5, Step(reply="back"))
    limits = llm.Limits(timeout_s=5, retry_s=120, backoff_s=2.0, max_tokens=100)
    t = [0.0]
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        t[0] += s

    done = llm.complete(
        llm.Endpoint(model="model-a", base_url=server.base_url, api_key=KEY),
        MESSAGES,
        limits=limits,
        sleep=sleep,
        clock=lambda: t[0],
    )
    assert done.text == "back" and done.attempts == 6
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0]


def test_the_window_ends_the_retries_and_the_error_names_every_cause(server):
    server.script.add(
        Step(status=503, message="overloaded"),
        Step(status=429, message="slow down"),
        Step(status=503, message="overloaded"),
        Step(status=500, message="boom"),
    )
    limits = llm.Limits(timeout_s=5, retry_s=20, backoff_s=1.0, max_tokens=100)
    t = [0.0]
    with pytest.raises(llm.LLMUnavailable) as caught:
        llm.complete(
            llm.Endpoint(model="model-a", base_url=server.base_url, api_key=KEY),
            MESSAGES,
            limits=limits,
            sleep=lambda s: t.__setitem__(0, t[0] + s),
            clock=lambda: t[0],
        )
    text = str(caught.value)
    assert "causes: 503: overloaded; 429: slow down; 500: boom" in text
    assert "retry window 20 s" in text and KEY not in text


@pytest.mark.parametrize(
    ("step", "text"),
    [
        (
            Step(status=401, message=f"Incorrect API key provided: {KEY}"),
            "refused the API key (401)",
        ),
        (Step(reply="hi", models=("other",)), "model 'model-a' or the endpoint"),
        (Step(status=400, message="bad request"), "refused the request (400)"),
    ],
)
def test_a_bad_key_or_an_unknown_model_is_fatal_at_once_and_never_shows_the_key(server, step, text):
    server.script.add(step)
    with pytest.raises(llm.LLMFatal) as info:
        _call(server)
    assert text in str(info.value) and KEY not in str(info.value)
    assert len(server.requests) == 1  # not retried


def test_a_silent_server_times_out_and_is_retried(server):
    server.script.add(Step(reply="late", delay_s=1.5), Step(reply="on time"))
    limits = llm.Limits(timeout_s=0.5, attempts=2, backoff_s=0.01, max_tokens=100)
    done, _, retries, _ = _call(server, limits=limits)
    assert done.text == "on time" and "no reply within 0.5 s" in retries[0][1]


def test_a_reply_that_streams_too_long_is_cut_and_retried(server):
    server.script.add(Step(reply="z" * 40, chunk_chars=4, chunk_delay_s=0.15), Step(reply="quick"))
    limits = llm.Limits(timeout_s=5, max_reply_s=0.5, attempts=2, backoff_s=0.01, max_tokens=100)
    done, _, retries, _ = _call(server, limits=limits)
    assert done.text == "quick" and "took over 0.5 s" in retries[0][1]


def test_a_lost_lease_aborts_the_stream(server):
    server.script.add(Step(reply="w" * 40, chunk_chars=4, chunk_delay_s=0.05))
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(llm.LeaseLost):
        _call(server, cancelled=cancelled)


def test_a_stop_while_a_retry_waits_ends_the_wait_at_once(server):
    """During an outage the wait between attempts can last a minute and the window ten: a
    search stopped meanwhile gives the reply up within a second, with the causes seen."""
    server.script.add(Step(status=503, message="down"))
    wanted = [True]

    def stopped_now(attempt: int, why: str, wait: float) -> None:
        wanted[0] = False  # the user stops the search as the first retry starts waiting

    started = time.monotonic()
    with pytest.raises(llm.LeaseLost, match="while waiting to retry .*503: down"):
        llm.complete(
            llm.Endpoint(model="model-a", base_url=server.base_url, api_key=KEY),
            MESSAGES,
            limits=llm.Limits(timeout_s=5, retry_s=600, backoff_s=30.0, max_tokens=100),
            on_retry=stopped_now,
            wanted=lambda: wanted[0],
        )
    assert time.monotonic() - started < 5
    assert len(server.requests) == 1


def test_the_endpoint_repr_hides_the_key():
    assert KEY not in repr(llm.Endpoint(model="m", base_url="http://x", api_key=KEY))
    assert llm.redact(f"bad key {KEY}") == "bad key sk-***"
