"""Errors the domain layer raises. All are ValidationErrors, so a form shows them as-is.

Errors about input carry a field -> messages dict (`error.message_dict`) where a field is to
blame, so a view can attach each message to its form field with `form.add_error(None, error)`.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

_KEYLIKE = re.compile(r"\b(sk|key|token)-[A-Za-z0-9_\-*]{6,}", re.I)


def redact(message: str, key: str = "") -> str:
    """`message` with `key`, and anything shaped like an API key, replaced by ***."""
    if key:
        message = message.replace(key, "***")
    return _KEYLIKE.sub(lambda m: m.group(1) + "-***", message)


class DomainError(ValidationError):
    """Bad input or a request the current state does not allow; nothing was saved."""


class IllegalTransition(DomainError):
    """A state change the row's lifecycle does not allow (e.g. resuming a finished search)."""


class DuplicateCandidate(DomainError):
    """The same candidate source was already recorded in this search."""


class InvalidReport(DomainError):
    """A harness report that does not follow the report schema."""


class UnknownWorker(DomainError):
    """A heartbeat from a worker that never registered."""
