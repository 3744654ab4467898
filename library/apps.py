from __future__ import annotations

from django.apps import AppConfig


class LibraryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "library"
    verbose_name = "Review and kernel library"

    def ready(self) -> None:
        from core import control
        from library import panels, selectors, watch
        from searches import hooks

        # `searches` imports no app built on it: the library hands it its releases and the
        # trial page's review panel here.
        hooks.provide_releases(selectors.released_speedups)
        hooks.provide_trial_panel(panels.review_panel)
        control.on_orchestrator_start("re-validating approval(s)", watch.recover)
