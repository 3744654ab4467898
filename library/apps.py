from __future__ import annotations

from django.apps import AppConfig


class LibraryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "library"
    verbose_name = "Review and kernel library"

    def ready(self) -> None:
        # `searches` imports no app built on it: the library hands it what it needs here.
        from library import selectors, watch
        from searches import hooks

        hooks.provide_releases(selectors.released_speedups)
        hooks.on_orchestrator_start(watch.recover)  # approvals still re-validating
