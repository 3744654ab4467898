"""The two roles: engineers submit ideas and run searches; reviewers also approve and veto.

Roles are Django groups (created by the `searches` app's migration 0002). Reviewers count as
engineers, and superusers hold both roles, so a check never needs to name more than one group.
Staff (Django's `is_staff`, the admin site) is not a role of its own in the app, with one
exception: staff who see searches may steer anyone's (`may_steer`). docs/deploy.md has the whole
access table.
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


def is_staff(user: Any) -> bool:
    return _active(user) and bool(user.is_staff or user.is_superuser)


def may_steer(user: Any, search: Any) -> bool:
    """Whether `user` may change a search's model or endpoint: its owner (while an engineer),
    a reviewer, or staff who see searches (an engineer too)."""
    if not is_engineer(user):
        return False
    return search.created_by_id == user.pk or is_reviewer(user) or is_staff(user)
