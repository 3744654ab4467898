"""One streamed chat completion through the official openai client, with bounded retries.

Rate limits (429), server errors (5xx), dropped connections and timeouts are retried with
exponential backoff (or the server's Retry-After); a refused key (401/403), an unknown model or
endpoint (404) and a refused request (400, 422) are `LLMFatal`: retrying cannot help, the search
stops with the message. API keys never appear in a message this module raises or logs.

Only the "default" endpoint (OPENAI_BASE_URL) gets the openai client as the server's environment
configures it. Any other declared endpoint gets only its own key and the headers a completion
needs; a custom URL also has its address checked before each attempt and the connection pinned
to that address (searches/agent/netguard.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import openai

from core.errors import redact
from searches.agent import netguard

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
WANTED_S = 1.0  # how often a retry's wait asks whether the reply is still wanted


class LLMError(Exception):
    """The endpoint gave no reply; the message is safe to show (no key in it)."""


class LLMFatal(LLMError):
    """Retrying cannot help: a bad key, an unknown model, a refused request."""


class LLMUnavailable(LLMError):
    """Every attempt hit a rate limit, a server error or a timeout."""


class LeaseLost(LLMError):
    """The reply is no longer wanted: another orchestrator took the search over while it
    streamed, or the search stopped while a retry waited."""


DEFAULT, DECLARED, CUSTOM = "default", "declared", "custom"


@dataclass(frozen=True)
class Endpoint:
    model: str
    base_url: str = ""
    api_key: str = ""
    kind: str = DEFAULT  # DEFAULT, DECLARED (by the operator) or CUSTOM (typed by a user)
    allow: netguard.Allowlist = netguard.Allowlist()  # CUSTOM: what it may reach though private

    def __repr__(self) -> str:  # never the key
        return f"Endpoint(model={self.model!r}, base_url={self.base_url!r}, kind={self.kind!r})"


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0  # connecting, or waiting for the next streamed chunk
    max_reply_s: float = 900.0  # one whole reply
    retry_s: float = 600.0  # keep retrying for this long (a rate limit, 5xx, timeouts)
    attempts: int | None = None  # and at most this many attempts (None: no count cap)
    backoff_s: float = 2.0
    max_tokens: int = 8000


@dataclass(frozen=True)
class Completion:
    text: str
    tokens_in: int
    tokens_out: int
    attempts: int
    usage_reported: bool  # False: the server sent no usage, the counts are estimates


def _status_message(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else str(err)
    else:
        msg = str(body or e.message)
    return " ".join(str(msg).split())[:300]


_SERVER_KEY_HINT = {
    DEFAULT: " or in OPENAI_API_KEY",
    DECLARED: " or in the variable AUTOWEB_LLM_ENDPOINTS names for it",
}


def _fatal(e: openai.APIStatusError, endpoint: Endpoint) -> LLMFatal:
    detail = redact(_status_message(e), endpoint.api_key)
    where = endpoint.base_url or "the default OpenAI endpoint"
    if e.status_code in (401, 403):
        text = (
            f"the LLM endpoint {where} refused the API key ({e.status_code}): {detail}. "
            f"Set a valid key on the search page{_SERVER_KEY_HINT.get(endpoint.kind, '')}."
        )
    elif e.status_code == 404:
        text = (
            f"model {endpoint.model!r} or the endpoint {where} was not found (404): {detail}. "
            "Switch the model on the search page, or fix the base URL."
        )
    else:
        text = f"the LLM endpoint {where} refused the request ({e.status_code}): {detail}"
    return LLMFatal(text)


def _retry_after(e: Exception) -> float | None:
    response = getattr(e, "response", None)
    if response is None:
        return None
    raw = response.headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def complete(
    endpoint: Endpoint,
    messages: list[dict[str, str]],
    *,
    limits: Limits,
    on_delta: Callable[[str], None] = lambda text: None,
    on_retry: Callable[[int, str, float], None] = lambda attempt, why, wait: None,
    cancelled: threading.Event | None = None,
    sleep: Callable[[float], None] | None = None,
    wanted: Callable[[], bool] = lambda: True,
    clock: Callable[[], float] = time.monotonic,
) -> Completion:
    """Stream one reply; `on_delta` gets the text as it arrives (also of attempts later retried).

    Rate limits, 5xx and timeouts are retried with backoff for `limits.retry_s` (and at most
    `limits.attempts` times, if set); then `LLMUnavailable` names every distinct cause seen.

    `cancelled` (set from another thread) aborts between chunks with `LeaseLost`, and so does
    `wanted()` turning false while a retry waits (asked every WANTED_S; the search stopped):
    a stop during an outage does not wait out the retry window. `sleep` replaces that wait.
    """
    causes: list[str] = []  # distinct, in the order first seen
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            client = _client(endpoint, limits)
            return _stream(client, endpoint, messages, limits, on_delta, cancelled, attempt)
        except netguard.AddressRefused as e:
            raise LLMFatal(f"the LLM endpoint {endpoint.base_url} is refused: {e}") from None
        except netguard.Unresolvable as e:
            why, wait = str(e), None
        except openai.APIStatusError as e:
            if e.status_code == 429 or e.status_code >= 500 or e.status_code == 408:
                why = f"{e.status_code}: {redact(_status_message(e), endpoint.api_key)}"
                wait = _retry_after(e)
            else:
                raise _fatal(e, endpoint) from None
        except openai.APITimeoutError:
            why, wait = f"no reply within {limits.timeout_s:g} s", None
        except openai.APIConnectionError as e:
            why, wait = f"connection failed: {redact(str(e), endpoint.api_key)}"[:300], None
        except _ReplyTooSlow as e:
            why, wait = str(e), None
        if why not in causes:
            causes.append(why)
        if wait is None:
            wait = limits.backoff_s * 2 ** (attempt - 1)
        wait = min(wait, MAX_BACKOFF_S)
        spent = clock() - started
        if attempt == limits.attempts or spent + wait > limits.retry_s:
            break
        log.warning(
            "LLM %s attempt %d failed (%s); retrying in %.1f s", endpoint.model, attempt, why, wait
        )
        on_retry(attempt, why, wait)
        if sleep is not None:
            sleep(wait)
        elif not _wait(wait, cancelled, wanted):
            raise LeaseLost(f"stopped while waiting to retry (causes: {'; '.join(causes)})"[:1000])
    raise LLMUnavailable(
        f"the LLM endpoint gave no reply after {attempt} attempts in {spent:.0f} s "
        f"(retry window {limits.retry_s:g} s; causes: {'; '.join(causes)})"[:1000]
    )


def _wait(seconds: float, cancelled: threading.Event | None, wanted: Callable[[], bool]) -> bool:
    """Sleep `seconds`; False as soon as `cancelled` is set or `wanted()` is false."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        step = min(left, WANTED_S)
        if cancelled is not None:
            if cancelled.wait(step):
                return False
        else:
            time.sleep(step)
        if not wanted():
            return False
    return True


class _ReplyTooSlow(Exception):
    pass


def _client(endpoint: Endpoint, limits: Limits) -> openai.OpenAI:
    """A client for one attempt. Never `api_key=None`: the openai client would then read the
    server's OPENAI_API_KEY, whatever the endpoint."""
    http_client = None
    hooks = {"request": [netguard.own_headers_only(endpoint.api_key)]}
    if endpoint.kind == CUSTOM:
        checked = netguard.check(endpoint.base_url, endpoint.allow)
        http_client = openai.DefaultHttpxClient(
            transport=netguard.PinnedTransport(checked),
            event_hooks=hooks,
            follow_redirects=False,  # a redirect would lead past the address check
            trust_env=False,  # no proxy or .netrc from the server's environment
        )
    elif endpoint.kind == DECLARED:
        http_client = openai.DefaultHttpxClient(event_hooks=hooks)
    return openai.OpenAI(
        api_key=endpoint.api_key or "unused",  # local servers (vLLM, Ollama) take any key
        base_url=endpoint.base_url or None,
        timeout=limits.timeout_s,
        max_retries=0,  # retried here: visible, bounded, with the search's own backoff
        http_client=http_client,
    )


def _stream(
    client: openai.OpenAI,
    endpoint: Endpoint,
    messages: list[dict[str, str]],
    limits: Limits,
    on_delta: Callable[[str], None],
    cancelled: threading.Event | None,
    attempt: int,
) -> Completion:
    deadline = time.monotonic() + limits.max_reply_s
    stream = client.chat.completions.create(
        model=endpoint.model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=limits.max_tokens,
        temperature=0.7,
    )
    parts: list[str] = []
    usage = None
    try:
        for chunk in stream:
            if cancelled is not None and cancelled.is_set():
                raise LeaseLost("another orchestrator took this search over")
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage
            for choice in chunk.choices or []:
                text = getattr(choice.delta, "content", None) if choice.delta else None
                if text:
                    parts.append(text)
                    on_delta(text)
            if time.monotonic() > deadline:
                raise _ReplyTooSlow(f"the reply took over {limits.max_reply_s:g} s")
    finally:
        stream.close()
    text = "".join(parts)
    prompt_chars = sum(len(m["content"]) for m in messages)
    if usage is not None and usage.prompt_tokens is not None:
        return Completion(
            text, int(usage.prompt_tokens), int(usage.completion_tokens or 0), attempt, True
        )
    return Completion(text, prompt_chars // 4 + 1, len(text) // 4 + 1, attempt, False)
