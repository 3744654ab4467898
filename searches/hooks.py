"""Where apps built on `searches` plug in, so that `searches` imports none of them.

Imports between the apps go one way (docs/architecture.md): `library` imports `searches`, never
the reverse. What `searches` needs from an app built on it, the app hands over in its
`AppConfig.ready()`:

- `provide_releases(fn)`: `fn()` returns the released kernels the charts draw, one row per
  (GPU kind, problem): ``{"kind", "problem", "speedup_eager", "speedup_compiled", "label",
  "url"}`` (the library app: the best active release of each).
- `provide_trial_panel(fn)`: `fn(trial)` returns HTML the trial page shows under its summary
  (the library app: the trial's review status), rendered by the app from its own templates.

What an app resumes when an orchestrator starts, it registers with `core.control` (as
`searches` itself does), not here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

_release_providers: list[Callable[[], Iterable[dict[str, Any]]]] = []


def provide_releases(fn: Callable[[], Iterable[dict[str, Any]]]) -> None:
    if fn not in _release_providers:
        _release_providers.append(fn)


_trial_panels: list[Callable[[Any], str]] = []


def provide_trial_panel(fn: Callable[[Any], str]) -> None:
    if fn not in _trial_panels:
        _trial_panels.append(fn)


def trial_panels(trial: Any) -> list[str]:
    """Every provider's HTML for the trial page, in the order the apps registered."""
    return [fn(trial) for fn in _trial_panels]


def released_speedups() -> list[dict[str, Any]]:
    """Every provider's rows; none (and the charts say "No releases") without a provider."""
    return [dict(row) for provider in _release_providers for row in provider()]
