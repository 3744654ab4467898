"""What other apps add to the searches app, registered from their `AppConfig.ready`, so that
imports between apps go one way: `library` imports `searches`, never the reverse.

- recovery hooks: run by `manage.py orchestrator` at start-up, after the searches' own
  `orchestrator.recover()` (the library's re-validation watchers, say);
- the released speedups the charts draw (`chart_data.releases()`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_recovery: dict[str, Callable[[], int]] = {}
_releases: list[Callable[[], list[dict[str, Any]]]] = []


def on_orchestrator_start(name: str, hook: Callable[[], int]) -> None:
    """`hook()` runs when an orchestrator starts; it returns how many things it resumed."""
    _recovery[name] = hook


def recover_all() -> dict[str, int]:
    return {name: hook() for name, hook in _recovery.items()}


def provide_releases(provider: Callable[[], list[dict[str, Any]]]) -> None:
    """`provider()` returns the best release per (GPU kind, problem), rows of
    {"kind", "problem", "speedup_eager", "speedup_compiled", "label", "url"}."""
    if provider not in _releases:
        _releases.append(provider)


def releases() -> list[dict[str, Any]]:
    return [dict(row) for provider in _releases for row in provider()]
