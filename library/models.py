"""Human review of candidates, re-validation runs, and the releases the library dispatches.

A trial gets at most one Review (approve, veto or send back): the OneToOne makes a second
decision on the same candidate impossible, whoever submits it. An approval starts one
Revalidation per target GPU kind; each that passes becomes a Release. Releases are revoked,
never deleted, so the audit trail stays.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from searches.models import Trial


class Review(models.Model):
    class Action(models.TextChoices):
        APPROVE = "approve"
        VETO = "veto"
        SEND_BACK = "send_back", "send back"

    trial = models.OneToOneField(Trial, on_delete=models.PROTECT, related_name="review")
    action = models.CharField(max_length=16, choices=Action.choices)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reviews"
    )
    text = models.TextField(
        blank=True, help_text="Approval comment, veto reason or send-back note."
    )
    prohibit = models.BooleanField(
        default=False, help_text="The text was also added to the idea's prohibitions."
    )
    shape_range = models.JSONField(
        default=dict, blank=True, help_text='Approved range per dim, e.g. {"N": [1, 32768]}.'
    )
    request_key = models.CharField(max_length=100, unique=True, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.action} of trial {self.trial_id} by {self.reviewer_id}"

    @property
    def outcome(self) -> str:
        """approve: revalidating / released / partly released / rejected; else the action."""
        if self.action != self.Action.APPROVE:
            return self.get_action_display()
        states = [r.status for r in self.revalidations.all()]
        if not states or any(s == Revalidation.Status.QUEUED for s in states):
            return "re-validating"
        passed = states.count(Revalidation.Status.PASSED)
        if passed == len(states):
            return "released"
        return "partly released" if passed else "rejected by re-validation"


class Revalidation(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        PASSED = "passed"
        FAILED = "failed"

    review = models.ForeignKey(Review, on_delete=models.CASCADE, related_name="revalidations")
    kind = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    job_id = models.CharField(max_length=100, unique=True, null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    reasons = models.JSONField(default=list, blank=True)
    report = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["review_id", "kind"]
        constraints = [
            models.UniqueConstraint(fields=["review", "kind"], name="revalidation_kind_once")
        ]

    def __str__(self) -> str:
        return f"re-validation of review {self.review_id} on {self.kind} ({self.status})"

    @property
    def terminal(self) -> bool:
        return self.status != self.Status.QUEUED


class Release(models.Model):
    problem = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=64, db_index=True)
    dtype = models.CharField(max_length=32, blank=True)
    shape_range = models.JSONField(default=dict)
    source = models.TextField()
    source_sha256 = models.CharField(max_length=64)
    trial = models.ForeignKey(Trial, on_delete=models.PROTECT, related_name="releases")
    revalidation = models.OneToOneField(
        Revalidation, on_delete=models.PROTECT, related_name="release"
    )
    speedup_eager = models.FloatField(null=True, blank=True)
    speedup_compiled = models.FloatField(null=True, blank=True)
    geomean_ms = models.FloatField(null=True, blank=True)
    shapes = models.JSONField(
        default=list,
        blank=True,
        help_text="Per-shape measurements from re-validation, each with who serves the shape.",
    )
    # Counts of the per-shape table (`dispatch()`), kept beside it so that the releases list
    # says "k of n shapes on the kernel" without loading every release's measurements.
    dispatch_total = models.PositiveIntegerField(default=0)
    dispatch_on_kernel = models.PositiveIntegerField(default=0)
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approved_releases"
    )
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="revoked_releases",
    )
    revoke_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["problem", "kind", "-created_at"]
        indexes = [
            # The releases page's order: a page, however deep, is read off the index, not by
            # walking and sorting rows (each carries its source and per-shape measurements).
            models.Index(
                fields=["problem", "kind", "-created_at", "-id"], name="release_page_order"
            ),
            # Counts and the best active speedup per (problem, kind) from the index alone.
            models.Index(
                fields=["problem", "kind", "revoked_at", "speedup_eager"], name="release_best"
            ),
        ]

    def __str__(self) -> str:
        return f"release {self.pk}: {self.problem} on {self.kind}"

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def manifest_entry(self) -> dict[str, Any]:
        """What kernels.library reads for this release (see library.export)."""
        return {
            "id": self.pk,
            "problem": self.problem,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape_range": self.shape_range,
            "file": f"kernels/{self.problem}_{self.kind}_{self.pk}.py",
            "source_sha256": self.source_sha256,
            "speedup_eager": self.speedup_eager,
            "speedup_compiled": self.speedup_compiled,
            "geomean_ms": self.geomean_ms,
            "trial": {"search": self.trial.search_id, "index": self.trial.index},
            "approver": self.approver.get_username(),
            "created_at": self.created_at.isoformat(),
            "shapes": self.dispatch(),
        }

    def dispatch(self) -> list[dict[str, Any]]:
        """Per measured shape, who serves it: "kernel", "compiled" or "eager", with the times
        from re-validation (`ms` is the kernel's). Releases made before the table existed have
        rows without `serve`: none of them is listed, so their table is []."""
        return [
            {
                "shape": row.get("shape"),
                "serve": row["serve"],
                "ms": row.get("candidate_ms"),
                "eager_ms": row.get("eager_ms"),
                "compiled_ms": row.get("compiled_ms"),
            }
            for row in self.shapes or []
            if isinstance(row, dict) and row.get("serve") and isinstance(row.get("shape"), dict)
        ]

    def count_dispatch(self) -> None:
        """Set `dispatch_total` and `dispatch_on_kernel` from the table (before saving)."""
        rows = self.dispatch()
        self.dispatch_total = len(rows)
        self.dispatch_on_kernel = sum(1 for r in rows if r["serve"] == "kernel")
