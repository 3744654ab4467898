"""The two roles: engineers submit ideas and run searches; reviewers also approve and veto.

Roles are Django groups (created by migration 0002). Reviewers count as engineers, and
superusers hold both roles, so a check never needs to name more than one group.
"""

from __future__ import annotations

from typing import Any

ENGINEERS = "engineers"
REVIEWERS = "reviewers"
ROLES = (ENGINEERS, REVIEWERS)


def _group_names(user: Any) -> set[str]:
    # Cached on the user object: a page checks roles several times per request.
    cached = getattr(user, "_autoweb_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True))
        user._autoweb_groups = cached
    return cached


def _active(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def is_reviewer(user: Any) -> bool:
    if not _active(user):
        return False
    return user.is_superuser or REVIEWERS in _group_names(user)


def is_engineer(user: Any) -> bool:
    if not _active(user):
        return False
    return user.is_superuser or bool(_group_names(user) & {ENGINEERS, REVIEWERS})
