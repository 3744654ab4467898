"""Admin: decisions, re-validations and releases are records, read-only here (revoke from the
releases page, which keeps who and why)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from library.models import Release, Revalidation, Review


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Review)
class ReviewAdmin(_ReadOnly):
    list_display = ("id", "trial", "action", "reviewer", "prohibit", "created_at")
    list_filter = ("action", "prohibit", "created_at")
    search_fields = ("text", "reviewer__username")


@admin.register(Revalidation)
class RevalidationAdmin(_ReadOnly):
    list_display = ("id", "review", "kind", "status", "attempts", "created_at", "finished_at")
    list_filter = ("kind", "status")


@admin.register(Release)
class ReleaseAdmin(_ReadOnly):
    list_display = (
        "id",
        "problem",
        "kind",
        "dtype",
        "speedup_eager",
        "approver",
        "created_at",
        "revoked_at",
    )
    list_filter = ("problem", "kind", "revoked_at")
