from __future__ import annotations

from django.apps import AppConfig


class SearchesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "searches"
    verbose_name = "Searches"

    def ready(self) -> None:
        from core import control
        from searches import orchestrator

        control.on_orchestrator_start("active search(es)", orchestrator.recover)
