from __future__ import annotations

from django.apps import AppConfig


class LibraryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "library"
    verbose_name = "Review and kernel library"

    def ready(self) -> None:
        # What the searches app asks of this one, registered here (imports go library -> searches).
        from library import selectors, watch
        from searches import hooks

        hooks.on_orchestrator_start("re-validation watchers", watch.recover)
        hooks.provide_releases(selectors.released_speedups)
