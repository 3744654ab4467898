"""One pass of an LLM search in the orchestrator loop.

The agent invents, the tuner tunes: after an LLM candidate the harness accepted, whose source
has `# tune:` knobs, the built-in tuner searches those knobs (up to AUTOWEB_LLM_TUNE_TRIALS
trials, children of that candidate) before the model is asked again. The model is asked only
when nothing is in flight, so every prompt sees every result. Everything is derived from the
recorded trials, so a restarted orchestrator carries on where the last one stopped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db import transaction
from django.db.models import F

from core.errors import DomainError, DuplicateCandidate
from kernels.engine.proposers import KnobProposer, Tried
from kernels.knobs import KnobError, parse_knobs
from kernels.protocol import source_sha256
from searches import live, selectors, services
from searches.agent import context, endpoints, llm, prompt, reply
from searches.models import LLM_PREFIX, Search, StopReason, Trial

log = logging.getLogger(__name__)

IN_FLIGHT = Trial.IN_FLIGHT
FLUSH_S = 0.25
FLUSH_CHARS = 2000
RENEW_S = 3.0
STOP_CHECK_S = 1.0
MAX_KEPT_REPLY = 100_000  # characters of an unusable reply kept on its trial


def current_model(search: Search) -> str:
    return search.model or search.idea.model_name or settings.AUTOWEB_DEFAULT_MODEL


def endpoint_for(search: Search) -> llm.Endpoint:
    """Where the search's next request goes (searches/agent/endpoints.py); `LLMFatal` when it
    cannot go anywhere (an endpoint no longer declared, a key that cannot be decrypted)."""
    return endpoints.endpoint_for(search, current_model(search))


def limits(max_tokens: int) -> llm.Limits:
    return llm.Limits(
        timeout_s=settings.AUTOWEB_LLM_TIMEOUT_S,
        max_reply_s=settings.AUTOWEB_LLM_MAX_REPLY_S,
        retry_s=settings.AUTOWEB_LLM_RETRY_S,
        attempts=settings.AUTOWEB_LLM_ATTEMPTS or None,
        backoff_s=settings.AUTOWEB_LLM_BACKOFF_MS / 1000,
        max_tokens=max_tokens,
    )


def cost_usd(model: str, tokens_in: int, tokens_out: int) -> float | None:
    price = settings.AUTOWEB_LLM_PRICES.get(model)
    if price is None:
        return None
    return (tokens_in * price[0] + tokens_out * price[1]) / 1e6


class TokenStream:
    """Batches streamed text into a few socket messages a second for the search's group."""

    def __init__(self, search_id: int, hint: str) -> None:
        self.search_id, self.hint = search_id, hint
        self.buffer: list[str] = []
        self.size = 0
        self.last = time.monotonic()

    def write(self, text: str) -> None:
        self.buffer.append(text)
        self.size += len(text)
        if self.size >= FLUSH_CHARS or time.monotonic() - self.last >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            live.token(self.search_id, self.hint, "".join(self.buffer))
        self.buffer, self.size, self.last = [], 0, time.monotonic()


@contextlib.contextmanager
def keep_lease(renew: Callable[[], bool] | None) -> Iterator[threading.Event]:
    """Renew the search's lease from a thread while the block runs (the prompt built, the
    model's reply); the event is set if the lease is lost (another loop took over), which
    keeps the model from being asked or aborts its reply between chunks.

    The first renewal is made on entry: building the prompt on a loaded machine can outlast
    the lease, and a reply asked for after it ran out would be thrown away when the thread
    first renewed (the reply's tokens spent, and another loop asking again)."""
    lost = threading.Event()
    stop = threading.Event()

    def renewed() -> bool:
        """False only when the lease is known to be lost."""
        try:
            return renew is None or renew()
        except Exception:  # Redis blips: the next renewal tries again
            log.debug("lease renewal failed", exc_info=True)
            return True

    def run() -> None:
        while not stop.wait(RENEW_S):
            if not renewed():
                lost.set()
                return

    if not renewed():
        lost.set()

    thread = threading.Thread(target=run, name="agent-lease", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join(timeout=RENEW_S + 1)


# -- the pass --------------------------------------------------------------------------------------


def fill(
    search: Search,
    kind: str,
    *,
    capacity: int,
    enqueue: Callable[[Trial], None],
    renew: Callable[[], bool] | None = None,
) -> None:
    """Propose what the loop should try next: tuner trials for the last accepted LLM candidate's
    knobs while any remain, else (nothing in flight) one LLM proposal."""
    in_flight = search.trials.filter(status__in=IN_FLIGHT).count()
    if tune(search, capacity=capacity - in_flight, enqueue=enqueue):
        return
    if in_flight:
        return
    propose(search, kind, enqueue=enqueue, renew=renew)


def _last_llm_trial(search: Search) -> Trial | None:
    return search.trials.filter(proposer__startswith=LLM_PREFIX).order_by("-index").first()


def tune(search: Search, *, capacity: int, enqueue: Callable[[Trial], None]) -> bool:
    """Hybrid tuning of the newest LLM candidate; True when it proposed something. (The model's
    turn comes only once nothing is in flight, so waiting needs no flag here.)"""
    base = _last_llm_trial(search)
    if base is None or settings.AUTOWEB_LLM_TUNE_TRIALS <= 0 or capacity <= 0:
        return False
    if not base.terminal or base.failure is not None or not base.knob_values:
        return False
    children = list(search.trials.filter(parent=base, proposer="tuner").order_by("index"))
    left = settings.AUTOWEB_LLM_TUNE_TRIALS - len(children)
    if left <= 0:
        return False
    tried = [Tried(values=base.knob_values, geomean_ms=base.geomean_ms, failed=False)]
    tried += selectors.tried_of(search, children, parent=base)
    try:
        tuner = KnobProposer(
            base.source, budget=settings.AUTOWEB_LLM_TUNE_TRIALS + 1, seed=search.seed
        )
    except KnobError:
        return False
    proposed = False
    while capacity > 0 and left > 0:
        proposal = tuner.next(tried)
        if proposal is None:
            break
        tried.append(
            Tried(values=proposal.knob_values, geomean_ms=None, failed=False, pending=True)
        )
        with transaction.atomic():
            try:
                trial = services.record_proposal(
                    search=search,
                    source=proposal.source,
                    parent=base,
                    proposer="tuner",
                    rationale=f"{proposal.rationale}; tuning trial {base.index}'s knobs",
                    knob_values=proposal.knob_values,
                )
            except DuplicateCandidate as e:
                # The variant's source was already tried: say so, and try the next variant.
                reason = "; ".join(e.messages)
                search = services.skip_variant(
                    search=search, values=proposal.knob_values, reason=reason, parent=base
                )
                live.search_changed(search)
                continue
            except DomainError as e:
                # e.g. out of trials: hand over to the model
                log.info("search %s: no tuner proposal recorded: %s", search.pk, e)
                break
            trial = services.screen_trial(trial=trial)
            if not trial.terminal:
                enqueue(trial)
        live.trial_changed(trial)
        proposed = True
        capacity -= 1
        left -= 1
    return proposed


def propose(
    search: Search,
    kind: str,
    *,
    enqueue: Callable[[Trial], None],
    renew: Callable[[], bool] | None = None,
) -> Trial | None:
    """Ask the model once, record what it wrote as a trial (failed `malformed` when unusable).
    The search's lease is kept from building the prompt to recording the reply."""
    with keep_lease(renew) as lost:
        return _propose(search, kind, enqueue=enqueue, lost=lost)


def _propose(
    search: Search, kind: str, *, enqueue: Callable[[Trial], None], lost: threading.Event
) -> Trial | None:
    search = Search.objects.select_related("idea", "incumbent").get(pk=search.pk)
    idea = search.idea
    try:
        endpoint = endpoint_for(search)
    except llm.LLMFatal as e:
        _fail(search, str(e))
        return None
    if not endpoint.model:
        _fail(search, "no LLM model: set one on the search page or AUTOWEB_DEFAULT_MODEL")
        return None
    inp = context.gather(search, kind)
    assembled = prompt.assemble(inp, settings.AUTOWEB_LLM_PROMPT_TOKENS)
    reply_cap = settings.AUTOWEB_LLM_MAX_OUTPUT_TOKENS
    if idea.max_tokens is not None:
        left = idea.max_tokens - search.tokens - assembled.tokens
        if left < 256:
            search = services.request_stop(
                search=search,
                reason=f"{StopReason.BUDGET_TOKENS} ({search.tokens} of {idea.max_tokens}; "
                f"the next prompt alone needs ~{assembled.tokens})",
            )
            live.search_changed(search)
            return None
        reply_cap = min(reply_cap, left)

    if lost.is_set():  # another loop may drive the search now: it asks the model
        log.info("search %s: lease lost before the model was asked", search.pk)
        return None
    step = search.trials.filter(proposer__startswith=LLM_PREFIX).count() + 1
    stream = TokenStream(search.pk, f"llm step {step}")
    stream.write(f"\n--- {endpoint.model}: proposal {step} ---\n")

    def retrying(attempt: int, why: str, wait: float) -> None:
        stream.write(f"\n[attempt {attempt} failed: {why}; retrying in {wait:.1f} s]\n")
        stream.flush()

    written: list[str] = []
    checked = [time.monotonic()]

    def delta(text: str) -> None:
        written.append(text)
        stream.write(text)
        # A user's stop ends the reply early instead of after minutes of tokens nobody uses.
        if time.monotonic() - checked[0] > STOP_CHECK_S:
            checked[0] = time.monotonic()
            if not _running(search.pk):
                lost.set()

    try:
        done = llm.complete(
            endpoint,
            assembled.messages,
            limits=limits(reply_cap),
            on_delta=delta,
            on_retry=retrying,
            cancelled=lost,
            wanted=lambda: _running(search.pk),
        )
    except llm.LeaseLost:
        stream.write("\n[stopped]\n")
        stream.flush()
        # The tokens were spent all the same (estimated: the server reports usage at the end).
        spent = assembled.tokens + len("".join(written)) // 4
        Search.objects.filter(pk=search.pk).update(tokens=F("tokens") + spent)
        return None
    except llm.LLMError as e:
        stream.write(f"\n[{e}]\n")
        stream.flush()
        _fail(search, str(e))
        return None
    stream.flush()
    return record(search, endpoint.model, assembled, done, step=step, enqueue=enqueue)


def _running(search_id: int) -> bool:
    return Search.objects.filter(pk=search_id, status=Search.Status.RUNNING).exists()


def record(
    search: Search,
    model: str,
    assembled: prompt.Prompt,
    done: llm.Completion,
    *,
    step: int,
    enqueue: Callable[[Trial], None],
) -> Trial | None:
    parsed = reply.parse_reply(done.text)
    source, problem = parsed.source, parsed.error
    knob_values: dict = {}
    if source is not None:
        twin = search.trials.filter(source_sha256=source_sha256(source)).first()
        if twin is not None:
            problem = f"the reply repeats trial {twin.index}'s source exactly"
        else:
            try:
                knob_values = {k.name: k.value for k in parse_knobs(source)}
            except KnobError as e:
                problem = f"its `# tune:` knobs do not parse: {e}"
    if problem is not None:
        # Still a trial (the tokens were spent, the model should hear why): the reply itself,
        # under a header that keeps it unique within the search.
        source = f"# LLM proposal {step} by {model}: malformed ({problem})\n" + (
            done.text[:MAX_KEPT_REPLY] if done.text.strip() else "# (empty reply)\n"
        )
    cost = cost_usd(model, done.tokens_in, done.tokens_out)
    rationale = parsed.rationale if parsed.ok else ""
    if not done.usage_reported:
        rationale = (rationale + "\n\n" if rationale else "") + "(token counts estimated)"
    with transaction.atomic():
        try:
            trial = services.record_proposal(
                search=search,
                source=source,
                parent=search.incumbent,
                proposer=f"{LLM_PREFIX}{model}",
                model=model,
                rationale=rationale,
                knob_values=knob_values,
                prompt=assembled.text,
                tokens_in=done.tokens_in,
                tokens_out=done.tokens_out,
            )
        except DomainError as e:
            # Stopped (or out of trials) while the model wrote: the tokens still count.
            log.info("search %s: LLM proposal not recorded: %s", search.pk, e)
            Search.objects.filter(pk=search.pk).update(
                tokens=F("tokens") + done.tokens_in + done.tokens_out,
                cost_usd=F("cost_usd") + (cost or 0.0),
            )
            return None
        if cost is not None:
            Trial.objects.filter(pk=trial.pk).update(cost_usd=cost)
            Search.objects.filter(pk=search.pk).update(cost_usd=F("cost_usd") + cost)
        if problem is not None:
            trial = services.reject_trial(trial=trial, failure="malformed", reasons=[problem])
        else:
            trial = services.screen_trial(trial=trial)
            if not trial.terminal:
                enqueue(trial)
    live.trial_changed(trial)
    search.refresh_from_db()
    live.search_changed(search)
    return trial


def _fail(search: Search, reason: str) -> None:
    search = services.fail_search(search=search, reason=reason[:450])
    live.search_changed(search)
