"""Switch a running LLM search's model or endpoint (the search page's form).

Only the search's owner, a reviewer or staff may; each change is recorded (`LLMChange`: who,
when, from and to, whether a key came with it; never the key). Moving a search to another
endpoint clears its stored key unless a new one comes with the move: a key given for one URL
never goes to another.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction

from core import roles
from core.errors import DomainError
from searches import crypto
from searches.agent import endpoints
from searches.agent.step import current_model
from searches.models import LLMChange, Search
from searches.services import MODEL_RE


def set_llm(
    *,
    search: Search,
    user: Any,
    model: str,
    endpoint: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    clear_key: bool = False,
) -> Search:
    """The model, and optionally the endpoint (a declared name, or "custom" with `base_url`)
    and key, for the next proposals. None or blank leaves the endpoint as it is; a typed
    `base_url` alone means "custom". The key is stored encrypted, never shown.

    The input is checked before the search's row is locked (a typed URL's host is resolved,
    which may wait on DNS); who may steer is checked before that, and again under the lock."""
    _require_steer(user, search)
    errors: dict[str, list[str]] = {}

    def bad(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    model = (model or "").strip() if isinstance(model, str) else ""
    if not model or len(model) > 200 or not MODEL_RE.match(model):
        bad(
            "model",
            f"{model!r} is not a model name (e.g. gpt-4o, qwen2.5-coder:32b, "
            "deepseek-ai/DeepSeek-V3).",
        )
    asked = endpoints.clean_target(endpoint, base_url, bad, current=endpoints.target_of(search))
    api_key = endpoints.clean_key(api_key, bad)
    with transaction.atomic():
        locked = Search.objects.select_for_update().select_related("idea").get(pk=search.pk)
        _require_steer(user, locked)
        if not locked.idea.model_name:
            raise DomainError(
                f"Search {locked.pk} runs the built-in tuner: it has no LLM to switch."
            )
        if not locked.is_active:
            raise DomainError(
                f"Search {locked.pk} is {locked.status}: its model can no longer change."
            )
        if errors:
            raise DomainError(errors)
        return _apply(locked, user, model, asked, api_key, clear_key)


def _require_steer(user: Any, search: Search) -> None:
    if not roles.is_engineer(user):
        raise PermissionDenied("Only engineers may change a search's model.")
    if not roles.may_steer(user, search):
        raise PermissionDenied(
            "Only the search's owner, a reviewer or staff may change its model or endpoint."
        )


def _apply(
    locked: Search,
    user: Any,
    model: str,
    asked: endpoints.Target | None,
    api_key: str,
    clear_key: bool,
) -> Search:
    before = endpoints.target_of(locked)
    after = asked or before
    change = LLMChange(
        search=locked,
        changed_by=user,
        from_model=current_model(locked),
        to_model=model,
        from_endpoint=str(before),
        to_endpoint=str(after),
    )
    fields = ["model"]
    locked.model = model
    if after != before:
        for name, value in after.fields.items():
            setattr(locked, name, value)
        fields += list(after.fields)
    if api_key:
        locked.llm_api_key = crypto.encrypt(api_key)
        change.key = LLMChange.Key.NEW
    elif (clear_key or after != before) and locked.llm_api_key:
        locked.llm_api_key = ""
        change.key = LLMChange.Key.CLEARED
    if change.key != LLMChange.Key.UNCHANGED:
        fields.append("llm_api_key")
    locked.save(update_fields=fields)
    moved = (change.from_model, change.from_endpoint) != (change.to_model, change.to_endpoint)
    if moved or change.key != LLMChange.Key.UNCHANGED:
        change.save()
    return locked
