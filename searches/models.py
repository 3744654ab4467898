"""Ideas, searches, trials and GPU workers.

Rows know their own lifecycle: the transition methods change fields in memory and raise
`IllegalTransition` for a move the lifecycle does not allow; `searches.services` takes the row
locks, calls them and saves. Nothing here talks to Redis or a GPU.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from core.errors import IllegalTransition
from kernels.protocol import FAILURES

# Sane caps on an idea's budget: a typo (an extra zero or three) is an error, not a month of GPU.
MAX_TRIALS_CAP = 100_000
MAX_GPU_MINUTES_CAP = 60 * 24 * 7
MAX_WALL_MINUTES_CAP = 60 * 24 * 30
MAX_TOKENS_CAP = 1_000_000_000
DEFAULT_PLATEAU_PATIENCE = 20

TUNER = "tuner"
LLM_PREFIX = "llm:"

FAILURE_CHOICES = [(name, name.replace("_", " ")) for name in FAILURES]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class Idea(models.Model):
    """What an engineer wants tried on one problem, with the budget a search may spend on it."""

    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, help_text="Markdown source; rendered safely.")
    problem = models.CharField(max_length=64, db_index=True)
    target_kinds = models.JSONField(default=list, help_text='GPU kinds, e.g. ["h200"].')
    proposer = models.CharField(max_length=200, default=TUNER, help_text='"tuner" or "llm:<model>"')
    sketch_source = models.TextField(blank=True, help_text="Optional candidate file.")
    prohibitions = models.TextField(blank=True, help_text="Extra prohibitions, one per line.")
    max_trials = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TRIALS_CAP)]
    )
    max_gpu_minutes = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_GPU_MINUTES_CAP)]
    )
    max_wall_minutes = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_WALL_MINUTES_CAP)]
    )
    max_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TOKENS_CAP)],
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="ideas"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    context_packs = models.JSONField(
        default=list, blank=True, help_text="Model context packs for the LLM's prompt, by name."
    )
    # Where an `llm:<model>` idea's searches start (searches/agent/endpoints.py): a declared
    # endpoint by name (blank: "default"), or a custom URL with the key typed with it, which is
    # encrypted and handed only to searches the idea's author starts.
    llm_endpoint = models.CharField(max_length=64, blank=True)
    llm_base_url = models.CharField(max_length=500, blank=True)
    llm_api_key = models.TextField(blank=True, help_text="Encrypted; never shown.")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.title} ({self.problem})"

    @property
    def prohibition_list(self) -> list[str]:
        return [line.strip() for line in self.prohibitions.splitlines() if line.strip()]

    @property
    def interpreter_only(self) -> bool:
        """Aimed only at Triton's CPU interpreter: its time is CPU time, not GPU time."""
        return bool(self.target_kinds) and set(self.target_kinds) == {"interpret"}

    @property
    def model_name(self) -> str | None:
        """The LLM model for an `llm:<model>` proposer; None for the tuner."""
        if self.proposer.startswith(LLM_PREFIX):
            return self.proposer[len(LLM_PREFIX) :]
        return None

    def start_source(self) -> str:
        """The kernel a search starts from: the engineer's sketch, else the problem's seed."""
        if self.sketch_source and self.sketch_source.strip():
            return self.sketch_source
        from kernels import problems

        return problems.load(self.problem).seed_path.read_text()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "title": self.title,
            "description": self.description,
            "problem": self.problem,
            "target_kinds": list(self.target_kinds),
            "proposer": self.proposer,
            "sketch_source": self.sketch_source,
            "prohibitions": self.prohibition_list,
            "max_trials": self.max_trials,
            "max_gpu_minutes": self.max_gpu_minutes,
            "max_wall_minutes": self.max_wall_minutes,
            "max_tokens": self.max_tokens,
            "context_packs": list(self.context_packs or []),
            "llm_endpoint": self.llm_endpoint,
            "llm_base_url": self.llm_base_url,
            "author": self.author.get_username() if self.author_id else None,
            "created_at": _iso(self.created_at),
        }


class StopReason:
    """Prefixes of `Search.stop_reason`; a detail may follow after the prefix."""

    BUDGET_TRIALS = "budget: trials"
    BUDGET_GPU_MINUTES = "budget: gpu minutes"
    BUDGET_WALL_TIME = "budget: wall time"
    BUDGET_TOKENS = "budget: tokens"
    PLATEAU = "plateau"
    USER = "stopped by user"
    ERROR = "error"


class Search(models.Model):
    """One run of the propose -> evaluate -> keep/revert loop on an idea."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        PAUSED = "paused"
        STOPPING = "stopping"
        FINISHED = "finished"
        FAILED = "failed"

    ACTIVE = (Status.QUEUED, Status.RUNNING, Status.PAUSED, Status.STOPPING)
    # A queued search may be stopped too: a cancelled start must not wait for an orchestrator.
    TRANSITIONS: dict[str, frozenset[str]] = {
        Status.QUEUED: frozenset({Status.RUNNING, Status.STOPPING, Status.FAILED}),
        Status.RUNNING: frozenset({Status.PAUSED, Status.STOPPING, Status.FAILED}),
        Status.PAUSED: frozenset({Status.RUNNING, Status.STOPPING, Status.FAILED}),
        Status.STOPPING: frozenset({Status.FINISHED, Status.FAILED}),
        # An ended search can be resumed from its history (incumbent, trials, notes).
        Status.FINISHED: frozenset({Status.QUEUED}),
        Status.FAILED: frozenset({Status.QUEUED}),
    }

    idea = models.ForeignKey(Idea, on_delete=models.PROTECT, related_name="searches")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    stop_reason = models.CharField(max_length=500, blank=True)
    request_key = models.CharField(
        max_length=100,
        unique=True,
        null=True,
        blank=True,
        help_text="Idempotency key: a double-clicked start makes one search.",
    )
    seed = models.PositiveIntegerField(default=0, help_text="Random seed for the tuner.")
    plateau_patience = models.PositiveIntegerField(
        default=DEFAULT_PLATEAU_PATIENCE,
        validators=[MinValueValidator(1)],
        help_text="Stop after this many trials in a row without a new incumbent.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="searches"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Counters, kept in step with the trials under the search's row lock.
    trials_total = models.PositiveIntegerField(default=0)
    trials_kept = models.PositiveIntegerField(default=0)
    trials_failed = models.PositiveIntegerField(default=0)
    trials_since_improvement = models.PositiveIntegerField(
        default=0, help_text="Judged trials in a row not kept, since the incumbent."
    )
    gpu_seconds = models.FloatField(default=0.0)
    tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.FloatField(default=0.0, help_text="LLM cost, where the model's price is set.")
    # The LLM endpoint (an `llm:<model>` idea): switchable while the search runs, by its owner,
    # a reviewer or staff (searches/agent/switch.py, which records each change). A declared
    # endpoint by name (blank: "default"), or a custom URL. The search's own key, if any, is
    # encrypted (searches/crypto.py) and write-only: no page, log or to_dict shows it.
    model = models.CharField(max_length=200, blank=True, help_text="The LLM now proposing.")
    llm_endpoint = models.CharField(max_length=64, blank=True)
    llm_base_url = models.CharField(max_length=500, blank=True)
    llm_api_key = models.TextField(blank=True, help_text="Encrypted; never shown.")
    incumbent = models.ForeignKey(
        "Trial", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The engine's account of the search (kernels.engine): which knob strategy ran and why,
    # the variants skipped (with the reason), and the per-shape dispatch table it ended with.
    strategy = models.CharField(max_length=500, blank=True)
    skipped = models.JSONField(default=list, blank=True)
    table = models.JSONField(null=True, blank=True)
    table_job_id = models.CharField(max_length=100, null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "searches"
        indexes = [models.Index(fields=["status", "-created_at"], name="search_status_created")]

    def __str__(self) -> str:
        return f"search {self.pk} on {self.idea.problem} ({self.status})"

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def accepts_proposals(self) -> bool:
        # Paused: a proposal already being written (an LLM mid-stream) is kept, not enqueued.
        return self.status in (self.Status.RUNNING, self.Status.PAUSED)

    def can_become(self, status: str) -> bool:
        return status in self.TRANSITIONS[self.status]

    def _move(self, status: str) -> None:
        if not self.can_become(status):
            raise IllegalTransition(f"search {self.pk} is {self.status}: it cannot become {status}")
        self.status = status

    def start(self, now: datetime) -> None:
        self._move(self.Status.RUNNING)
        self.started_at = self.started_at or now

    def pause(self) -> None:
        self._move(self.Status.PAUSED)

    def resume(self) -> None:
        """Paused -> running; finished or failed -> queued again, from where it stopped: the
        trials, incumbent, notes and what they spent stay (the trial, GPU and token budgets
        count them), the wall-clock budget starts again, the next orchestrator pass picks it up."""
        if self.status in (self.Status.FINISHED, self.Status.FAILED):
            self._move(self.Status.QUEUED)
            self.stop_reason = ""
            self.finished_at = None
            self.started_at = None  # the wall-clock budget counts from the resumed start
            return
        if self.status != self.Status.PAUSED:
            raise IllegalTransition(
                f"search {self.pk} is {self.status}: only a paused or ended one resumes"
            )
        self._move(self.Status.RUNNING)

    def request_stop(self, reason: str) -> None:
        self._move(self.Status.STOPPING)
        self.stop_reason = reason[:500]

    def finish(self, now: datetime, reason: str = "") -> None:
        """Stopping -> finished; a running or paused search passes through stopping."""
        if self.status in (self.Status.QUEUED, self.Status.RUNNING, self.Status.PAUSED):
            self.request_stop(reason or self.stop_reason)
        self._move(self.Status.FINISHED)
        if reason:
            self.stop_reason = reason[:500]
        self.finished_at = now

    def fail(self, now: datetime, reason: str) -> None:
        self._move(self.Status.FAILED)
        self.stop_reason = f"{StopReason.ERROR}: {reason}"[:500]
        self.finished_at = now

    # -- budget ---------------------------------------------------------------------------------

    def wall_seconds(self, now: datetime | None = None) -> float:
        if self.started_at is None:
            return 0.0
        end = self.finished_at or now or timezone.now()
        return max(0.0, (end - self.started_at).total_seconds())

    def budget(self, now: datetime | None = None) -> dict[str, dict[str, float | int | None]]:
        """Used and allowed, per budget (the page's budget bars)."""
        idea = self.idea
        return {
            "trials": {"used": self.trials_total, "max": idea.max_trials},
            "gpu_minutes": {"used": round(self.gpu_seconds / 60, 2), "max": idea.max_gpu_minutes},
            "wall_minutes": {
                "used": round(self.wall_seconds(now) / 60, 2),
                "max": idea.max_wall_minutes,
            },
            "tokens": {"used": self.tokens, "max": idea.max_tokens},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "idea_id": self.idea_id,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "seed": self.seed,
            "plateau_patience": self.plateau_patience,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "trials_total": self.trials_total,
            "trials_kept": self.trials_kept,
            "trials_failed": self.trials_failed,
            "trials_since_improvement": self.trials_since_improvement,
            "gpu_seconds": self.gpu_seconds,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "model": self.model,
            "llm_endpoint": self.llm_endpoint,
            "llm_base_url": self.llm_base_url,
            "incumbent_id": self.incumbent_id,
        }


class Trial(models.Model):
    """One candidate: proposed, evaluated on a GPU worker, then kept, reverted or failed."""

    class Status(models.TextChoices):
        PROPOSED = "proposed"
        QUEUED = "queued"
        COMPILING = "compiling"
        VERIFYING = "verifying"
        BENCHMARKING = "benchmarking"
        CONFIRMING = "confirming"  # a screening win, re-timed against the incumbent
        KEPT = "kept"
        REVERTED = "reverted"
        FAILED = "failed"

    TERMINAL = (Status.KEPT, Status.REVERTED, Status.FAILED)
    PHASES = (Status.COMPILING, Status.VERIFYING, Status.BENCHMARKING)
    IN_FLIGHT = (
        Status.PROPOSED,
        Status.QUEUED,
        Status.COMPILING,
        Status.VERIFYING,
        Status.BENCHMARKING,
        Status.CONFIRMING,
    )
    # Progress only moves forwards: a late "compiling" after "verifying" is ignored.
    PROGRESS = {
        Status.PROPOSED: 0,
        Status.QUEUED: 1,
        Status.COMPILING: 2,
        Status.VERIFYING: 3,
        Status.BENCHMARKING: 4,
        Status.CONFIRMING: 5,
    }

    search = models.ForeignKey(Search, on_delete=models.CASCADE, related_name="trials")
    index = models.PositiveIntegerField(help_text="1, 2, 3... within the search.")
    parent = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="children"
    )
    source = models.TextField()
    source_sha256 = models.CharField(max_length=64, db_index=True)
    proposer = models.CharField(max_length=200)
    model = models.CharField(max_length=200, null=True, blank=True)
    rationale = models.TextField(blank=True)
    knob_values = models.JSONField(default=dict, blank=True)
    prompt = models.TextField(null=True, blank=True)
    tokens_in = models.PositiveIntegerField(null=True, blank=True)
    tokens_out = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.FloatField(null=True, blank=True)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROPOSED)
    failure = models.CharField(max_length=32, choices=FAILURE_CHOICES, null=True, blank=True)
    # Failed: the report's reasons. Kept or reverted: one line saying why.
    reasons = models.JSONField(default=list, blank=True)
    report = models.JSONField(null=True, blank=True)
    # A screening win's confirmation: against which incumbent, why it was screened a win, and
    # (once re-timed) the interleaved numbers {"incumbent": ..., "challenger": ...}.
    confirmation = models.JSONField(null=True, blank=True)

    device_kind = models.CharField(max_length=64, blank=True)
    device_name = models.CharField(max_length=200, blank=True)
    versions = models.JSONField(default=dict, blank=True)
    geomean_ms = models.FloatField(null=True, blank=True)
    speedup_eager = models.FloatField(null=True, blank=True)
    speedup_compiled = models.FloatField(null=True, blank=True)
    noise = models.FloatField(null=True, blank=True)
    gpu_seconds = models.FloatField(default=0.0)

    job_id = models.CharField(max_length=100, unique=True, null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Every write touches it, so a reconnecting browser can ask for "what changed since".
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["search_id", "-index"]  # search_id: no join to order by
        constraints = [
            models.UniqueConstraint(fields=["search", "index"], name="trial_index_per_search"),
            models.UniqueConstraint(
                fields=["search", "source_sha256"], name="trial_source_once_per_search"
            ),
        ]
        indexes = [
            models.Index(fields=["search", "status"], name="trial_search_status"),
            models.Index(fields=["search", "updated_at"], name="trial_search_updated"),
            models.Index(fields=["status", "-finished_at"], name="trial_status_finished"),
            models.Index(fields=["model", "status"], name="trial_model_status"),
            # The charts' aggregates over every trial read only these columns. In SQLite they
            # sit after the report (22 KB), so without an index holding them each row read
            # walks the report's overflow pages. Status first: the aggregates filter on it,
            # with or without a GPU kind.
            models.Index(
                fields=["status", "device_kind", "failure", "finished_at", "proposer", "model"],
                name="trial_chart_outcomes",
            ),
            models.Index(
                fields=[
                    "status",
                    "device_kind",
                    "geomean_ms",
                    "speedup_eager",
                    "speedup_compiled",
                    "search",
                    "source_sha256",
                ],
                name="trial_chart_timed",
            ),
        ]

    def __str__(self) -> str:
        return f"trial {self.index} of search {self.search_id} ({self.status})"

    @property
    def terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def reason(self) -> str:
        return "; ".join(str(r) for r in self.reasons or [])

    def numbers(self):
        """What the judge (`kernels.engine.judge`) compares."""
        from kernels.engine.judge import Numbers

        return Numbers(self.geomean_ms, self.noise, self.device_kind)

    def queue(self, job_id: str, now: datetime) -> bool:
        """Queue (or re-queue, after a lost job) under `job_id`. False when nothing changed."""
        if self.terminal:
            raise IllegalTransition(
                f"trial {self.index} of search {self.search_id} is {self.status}: "
                "it cannot be queued again"
            )
        if self.job_id == job_id and self.status != self.Status.PROPOSED:
            return False
        self.status = self.Status.QUEUED
        self.job_id = job_id
        self.attempts += 1
        self.queued_at = now
        self.started_at = None
        return True

    def withdraw(self) -> None:
        """Its job left the GPU queue before any worker took it (its search is stopping): not
        evaluated. Queued -> proposed with no job, that attempt not counted; a confirming trial
        keeps its status and loses its re-time job. A resumed search queues either again."""
        if self.status == self.Status.QUEUED:
            self.status = self.Status.PROPOSED
            self.attempts = max(0, self.attempts - 1)
            self.queued_at = None
        elif self.status == self.Status.CONFIRMING:
            confirmation = dict(self.confirmation or {})
            confirmation["attempts"] = max(0, int(confirmation.get("attempts") or 0) - 1)
            self.confirmation = confirmation
        else:
            raise IllegalTransition(
                f"trial {self.index} of search {self.search_id} is {self.status}: "
                "only a queued or confirming trial is withdrawn"
            )
        self.job_id = None

    @property
    def holds_no_job(self) -> bool:
        """Unfinished, with no job queued or running: proposed, or confirming with no re-time
        job. A stopping search ends once every unfinished trial of it is like this."""
        return self.status == self.Status.PROPOSED or (
            self.status == self.Status.CONFIRMING and not self.job_id
        )

    def advance(self, phase: str, now: datetime) -> bool:
        """Move forwards to a running phase. False (no change) when finished or not forwards."""
        if phase not in self.PHASES:
            raise IllegalTransition(
                f"{phase!r} is not a phase; use one of {', '.join(self.PHASES)}"
            )
        if self.terminal or self.PROGRESS[phase] <= self.PROGRESS[self.status]:
            return False
        self.status = phase
        self.started_at = self.started_at or now
        return True

    def conclude(self, status: str, now: datetime) -> None:
        if status not in self.TERMINAL:
            raise IllegalTransition(f"{status!r} is not a verdict")
        if self.terminal:
            raise IllegalTransition(
                f"trial {self.index} of search {self.search_id} is already {self.status}"
            )
        self.status = status
        self.started_at = self.started_at or now
        self.finished_at = now

    def to_dict(self, *, full: bool = False) -> dict[str, Any]:
        """The row as JSON; `full` adds the source, prompt and the whole report."""
        data: dict[str, Any] = {
            "id": self.pk,
            "search_id": self.search_id,
            "index": self.index,
            "parent_id": self.parent_id,
            "source_sha256": self.source_sha256,
            "proposer": self.proposer,
            "model": self.model,
            "rationale": self.rationale,
            "knob_values": self.knob_values,
            "status": self.status,
            "terminal": self.terminal,
            "failure": self.failure,
            "reasons": list(self.reasons or []),
            "device_kind": self.device_kind,
            "device_name": self.device_name,
            "geomean_ms": self.geomean_ms,
            "speedup_eager": self.speedup_eager,
            "speedup_compiled": self.speedup_compiled,
            "noise": self.noise,
            "gpu_seconds": self.gpu_seconds,
            "job_id": self.job_id,
            "attempts": self.attempts,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": self.cost_usd,
            "created_at": _iso(self.created_at),
            "queued_at": _iso(self.queued_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }
        if full:
            data["source"] = self.source
            data["prompt"] = self.prompt
            data["versions"] = self.versions
            data["report"] = self.report
        return data


class Worker(models.Model):
    """A GPU worker process (several may share a GPU), as it last described itself."""

    name = models.CharField(max_length=200, unique=True, help_text="e.g. host:gpu0")
    kind = models.CharField(max_length=64, db_index=True)
    device_name = models.CharField(max_length=200, blank=True)
    ceilings = models.JSONField(null=True, blank=True)
    versions = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=100, help_text="gpu.<kind>")
    current_job_id = models.CharField(max_length=100, null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True, db_index=True)
    registered_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["kind", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @staticmethod
    def online_window() -> timedelta:
        return timedelta(seconds=settings.AUTOWEB_WORKER_ONLINE_S)

    def is_online(self, now: datetime | None = None) -> bool:
        if self.last_heartbeat is None:
            return False
        return (now or timezone.now()) - self.last_heartbeat <= self.online_window()

    @property
    def online(self) -> bool:
        return self.is_online()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "name": self.name,
            "kind": self.kind,
            "device_name": self.device_name,
            "ceilings": self.ceilings,
            "versions": self.versions,
            "queue": self.queue,
            "current_job_id": self.current_job_id,
            "last_heartbeat": _iso(self.last_heartbeat),
            "online": self.online,
        }


class SearchNote(models.Model):
    """What people said about a search that the agent should hear: a reviewer's veto reason, a
    note. The review app feeds it through `searches.agent.notes.add_note`; the prompt carries
    the newest ones."""

    class Kind(models.TextChoices):
        NOTE = "note"
        VETO = "veto"

    search = models.ForeignKey(Search, on_delete=models.CASCADE, related_name="notes")
    trial = models.ForeignKey(
        Trial, on_delete=models.SET_NULL, null=True, blank=True, related_name="notes"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.NOTE)
    text = models.TextField()
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} on search {self.search_id}"


class LLMChange(models.Model):
    """One change of a running search's model or endpoint: who, when, from what, to what.
    Never the key: only whether a new one came with the change or the stored one was cleared."""

    class Key(models.TextChoices):
        UNCHANGED = "unchanged"
        NEW = "new"
        CLEARED = "cleared"

    search = models.ForeignKey(Search, on_delete=models.CASCADE, related_name="llm_changes")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    changed_at = models.DateTimeField(default=timezone.now)
    from_model = models.CharField(max_length=200, blank=True)
    to_model = models.CharField(max_length=200)
    from_endpoint = models.CharField(max_length=600, help_text="A declared name or a custom URL.")
    to_endpoint = models.CharField(max_length=600)
    key = models.CharField(max_length=16, choices=Key.choices, default=Key.UNCHANGED)

    class Meta:
        ordering = ["-changed_at", "-id"]

    def __str__(self) -> str:
        return f"search {self.search_id}: {self.from_model} -> {self.to_model}"


class ContextPack(models.Model):
    """A context pack edited in the UI: a new version of a shipped markdown file, or a new pack.
    The newest version of a name wins over the shipped file; older versions are kept."""

    class Kind(models.TextChoices):
        MODEL = "model"
        HARDWARE = "hardware"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.MODEL)
    name = models.CharField(max_length=64)
    version = models.PositiveIntegerField()
    title = models.CharField(max_length=200, blank=True)
    body = models.TextField()
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["kind", "name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "name", "version"], name="pack_version_once")
        ]

    def __str__(self) -> str:
        return f"{self.kind} pack {self.name} v{self.version}"


class ReportImport(models.Model):
    """Where an imported trial was measured: a harness report made on another host (`python -m
    kernels evaluate --json`, or a report inside a benchmark bundle) and recorded here as the
    one trial of a finished search (searches/imports.py). Its numbers were not measured by this
    deployment's workers; approval re-validates on a worker of its GPU kind as for any trial."""

    trial = models.OneToOneField(Trial, on_delete=models.CASCADE, related_name="imported")
    report_sha256 = models.CharField(
        max_length=64, unique=True, help_text="Of the report and its source: one import each."
    )
    source_sha256 = models.CharField(max_length=64, help_text="Of the source the report judged.")
    host = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=64)
    device_name = models.CharField(max_length=200, blank=True)
    versions = models.JSONField(default=dict, blank=True, help_text="torch, triton, ...")
    file = models.CharField(max_length=500, help_text="The file it was read from.")
    entry = models.CharField(max_length=200, blank=True, help_text="Where in a bundle.")
    imported_at = models.DateTimeField(default=timezone.now)
    imported_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="report_imports"
    )

    class Meta:
        ordering = ["-imported_at", "-id"]

    def __str__(self) -> str:
        return f"{self.label}: trial {self.trial_id}"

    @property
    def label(self) -> str:
        return f"imported from {self.host or 'an unnamed host'} ({self.kind})"
