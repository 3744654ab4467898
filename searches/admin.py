"""Admin for every model. Recorded data (reports, counters, verdicts) is read-only here: it
comes from the harness and the services, and an edit by hand would break what it is derived
from. Lifecycle fields stay editable so an operator can unstick a search."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils.html import format_html

from searches.models import Idea, LLMChange, ReportImport, Search, Trial, Worker


def _pretty(value: Any) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap">{}</pre>', json.dumps(value, indent=2, sort_keys=True)
    )


def _json_field(field: str) -> Any:
    """A read-only admin column showing the JSON field `field` indented."""

    @admin.display(description=field.replace("_", " "))
    def show(self: admin.ModelAdmin, obj: Any) -> str:
        return _pretty(getattr(obj, field))

    return show


@admin.register(Idea)
class IdeaAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "problem", "proposer", "author", "max_trials", "created_at")
    list_filter = ("problem", "proposer", "created_at")
    search_fields = ("title", "description", "problem", "author__username")
    raw_id_fields = ("author",)
    date_hierarchy = "created_at"
    # The key is write-only; the endpoint is set through the idea form, which checks it.
    exclude = ("target_kinds", "llm_api_key")
    readonly_fields = ("target_kinds_json", "llm_endpoint", "llm_base_url")
    target_kinds_json = _json_field("target_kinds")


@admin.register(Search)
class SearchAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "idea",
        "status",
        "stop_reason",
        "trials_total",
        "trials_kept",
        "trials_failed",
        "gpu_seconds",
        "created_by",
        "created_at",
    )
    list_filter = ("status", "idea__problem", "created_at")
    search_fields = ("idea__title", "idea__problem", "stop_reason", "request_key")
    list_select_related = ("idea", "created_by")
    # Plain id inputs: a select listing every trial of every search would not load.
    raw_id_fields = ("idea", "created_by", "incumbent")
    exclude = ("llm_api_key",)  # write-only: set from the search page, never shown
    # The model and endpoint change only on the search page, which checks who may, checks a
    # typed URL, clears the key on a move and records the change.
    readonly_fields = (
        "model",
        "llm_endpoint",
        "llm_base_url",
        "request_key",
        "created_at",
        "trials_total",
        "trials_kept",
        "trials_failed",
        "trials_since_improvement",
        "gpu_seconds",
        "tokens",
    )


@admin.register(ReportImport)
class ReportImportAdmin(admin.ModelAdmin):
    """Where imported trials were measured (searches/imports.py): read-only, the audit trail."""

    list_display = ("imported_at", "trial", "host", "kind", "file", "entry", "imported_by")
    list_filter = ("kind", "host", "imported_at")
    search_fields = ("host", "file", "source_sha256", "report_sha256", "imported_by__username")
    list_select_related = ("trial", "imported_by")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(LLMChange)
class LLMChangeAdmin(admin.ModelAdmin):
    """The record of model and endpoint changes: read-only (deleted with its search)."""

    list_display = ("changed_at", "search", "changed_by", "from_model", "to_model", "to_endpoint")
    list_filter = ("changed_at",)
    search_fields = ("=search__id", "changed_by__username", "to_model", "to_endpoint")
    list_select_related = ("search__idea", "changed_by")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Trial)
class TrialAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "search",
        "index",
        "status",
        "failure",
        "proposer",
        "model",
        "device_kind",
        "geomean_ms",
        "speedup_eager",
        "speedup_compiled",
        "finished_at",
    )
    list_filter = ("status", "failure", "proposer", "device_kind")
    search_fields = ("=search__id", "source_sha256", "job_id", "model", "rationale")
    list_select_related = ("search__idea",)
    raw_id_fields = ("search", "parent")
    show_full_result_count = False  # no COUNT(*) over every trial on each list page
    readonly_fields = (
        "index",
        "source_sha256",
        "status",
        "failure",
        "device_kind",
        "device_name",
        "geomean_ms",
        "speedup_eager",
        "speedup_compiled",
        "noise",
        "gpu_seconds",
        "job_id",
        "attempts",
        "tokens_in",
        "tokens_out",
        "created_at",
        "queued_at",
        "started_at",
        "finished_at",
        "updated_at",
        "knob_values_json",
        "reasons_json",
        "versions_json",
        "report_json",
    )
    exclude = ("knob_values", "reasons", "versions", "report")
    knob_values_json = _json_field("knob_values")
    reasons_json = _json_field("reasons")
    versions_json = _json_field("versions")
    report_json = _json_field("report")

    def has_add_permission(self, request: Any) -> bool:
        return False  # trials are recorded by the search loop, never typed in


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "device_name",
        "queue",
        "is_online",
        "current_job_id",
        "last_heartbeat",
    )
    list_filter = ("kind", "queue")
    search_fields = ("name", "device_name", "current_job_id")
    readonly_fields = (
        "registered_at",
        "last_heartbeat",
        "current_job_id",
        "ceilings_json",
        "versions_json",
    )
    exclude = ("ceilings", "versions")
    ceilings_json = _json_field("ceilings")
    versions_json = _json_field("versions")

    def has_add_permission(self, request: Any) -> bool:
        return False  # workers register themselves

    @admin.display(boolean=True, description="online")
    def is_online(self, obj: Worker) -> bool:
        return obj.online
