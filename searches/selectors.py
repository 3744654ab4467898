"""Reads for the pages: what the views show, gathered without writing anything."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernels import problems as registry


@dataclass
class ProblemListing:
    problems: list[dict[str, Any]] = field(default_factory=list)
    # One line per problem that failed to load (a user's problem directory may hold a broken
    # module); the page shows them instead of failing as a whole.
    errors: list[str] = field(default_factory=list)


def list_problems() -> ProblemListing:
    listing = ProblemListing()
    try:
        names = registry.names()
    except registry.ProblemError as exc:
        listing.errors.append(str(exc))
        return listing
    for name in names:
        try:
            listing.problems.append(registry.load(name).to_dict())
        except Exception as exc:  # a problem module is user code: any error it raises is shown
            listing.errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return listing
