"""Switch a running LLM search's model or endpoint (the search page's form)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.db import transaction

from searches import roles
from searches.errors import DomainError
from searches.models import Search
from searches.services import MODEL_RE

MAX_URL = 500
MAX_KEY = 500


@transaction.atomic
def set_llm(
    *,
    search: Search,
    user: Any,
    model: str,
    base_url: str | None = None,
    api_key: str | None = None,
    clear_key: bool = False,
) -> Search:
    """The model (and optionally base URL / key) for the next proposals. None leaves a field as
    it is; a blank base URL means the settings' default. The key is stored, never shown."""
    if not roles.is_engineer(user):
        from django.core.exceptions import PermissionDenied

        raise PermissionDenied("Only engineers may change a search's model.")
    locked = Search.objects.select_for_update().select_related("idea").get(pk=search.pk)
    errors: dict[str, list[str]] = {}
    if not locked.idea.model_name:
        raise DomainError(f"Search {locked.pk} runs the built-in tuner: it has no LLM to switch.")
    if not locked.is_active:
        raise DomainError(f"Search {locked.pk} is {locked.status}: its model can no longer change.")
    model = (model or "").strip() if isinstance(model, str) else ""
    if not model or len(model) > 200 or not MODEL_RE.match(model):
        errors["model"] = [
            f"{model!r} is not a model name (e.g. gpt-4o, qwen2.5-coder:32b, "
            "deepseek-ai/DeepSeek-V3)."
        ]
    if base_url is not None:
        base_url = base_url.strip()
        parts = urlsplit(base_url) if base_url else None
        if base_url and (
            len(base_url) > MAX_URL or parts.scheme not in ("http", "https") or not parts.netloc
        ):
            errors["base_url"] = [
                "A base URL is http(s)://host[:port]/path, e.g. http://127.0.0.1:8001/v1; "
                "leave it blank for the default."
            ]
        elif parts is not None and (parts.username or parts.password):
            # A URL is shown on the page: credentials belong in the write-only key field.
            errors["base_url"] = ["Put credentials in the API key field, not in the URL."]
    if api_key and (len(api_key) > MAX_KEY or any(c.isspace() for c in api_key)):
        errors["api_key"] = [f"An API key is one word of at most {MAX_KEY} characters."]
    if errors:
        raise DomainError(errors)
    locked.model = model
    fields = ["model"]
    if base_url is not None:
        locked.llm_base_url = base_url
        fields.append("llm_base_url")
    if clear_key:
        locked.llm_api_key = ""
        fields.append("llm_api_key")
    elif api_key:
        locked.llm_api_key = api_key
        fields.append("llm_api_key")
    locked.save(update_fields=fields)
    return locked
