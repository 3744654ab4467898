"""Every URL the project serves, walked from its resolver, with sample arguments: the security
tests use it so that a page added later is covered without anyone listing it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.urls import URLPattern, URLResolver, get_resolver, reverse

# Django admin's own patterns without a name, and how to make a URL for each.
_ADMIN_OBJECT = re.compile(r"^admin/(\w+)/(\w+)/<path:object_id>/$")
_ADMIN_CATCH_ALL = "admin/(?P<url>.*)$"
_ADMIN_NAME = re.compile(r"^admin:(\w+?)_(\w+)_(?:change|delete|history)$")


@dataclass(frozen=True)
class Route:
    name: str  # "namespace:name", or the pattern of an unnamed admin one
    url: str

    @property
    def admin(self) -> bool:
        return self.url.startswith("/admin/")


def _walk(patterns: list, namespaces: tuple[str, ...], prefix: str):
    for p in patterns:
        if isinstance(p, URLResolver):
            ns = (*namespaces, p.namespace) if p.namespace else namespaces
            yield from _walk(p.url_patterns, ns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield namespaces, p, prefix + str(p.pattern)


def _object_id(app_label: str, model_name: str) -> str:
    model = apps.get_model(app_label, model_name)
    pk = model._default_manager.order_by("pk").values_list("pk", flat=True).first()
    return str(pk if pk is not None else 1)


def routes(samples: dict[str, Any]) -> list[Route]:
    """One URL per pattern of the project. Arguments come from `samples` by parameter name
    (a parameter without one fails loudly: add it); the admin's object ids are real rows."""
    found = []
    for namespaces, pattern, full in _walk(get_resolver().url_patterns, (), ""):
        if pattern.name is None:
            if full == _ADMIN_CATCH_ALL:
                found.append(Route(full, "/admin/no-such-page/"))
                continue
            match = _ADMIN_OBJECT.match(full)
            assert match, f"an unnamed URL pattern {full!r}: teach tests/web/routes.py about it"
            app_label, model = match.groups()
            url = f"/admin/{app_label}/{model}/{_object_id(app_label, model)}/"
            found.append(Route(full, url))
            continue
        name = ":".join((*namespaces, pattern.name))
        kwargs: dict[str, Any] = {}
        for param in pattern.pattern.regex.groupindex:
            admin_object = _ADMIN_NAME.match(name)
            if param == "object_id" and admin_object:
                kwargs[param] = _object_id(*admin_object.groups())
            elif param == "id" and name == "admin:auth_user_password_change":
                kwargs[param] = _object_id("auth", "user")
            else:
                assert param in samples, f"{name}: no sample for {param!r}"
                value = samples[param]
                kwargs[param] = value(name) if isinstance(value, Callable) else value
        found.append(Route(name, reverse(name, kwargs=kwargs)))
    return found


# Pages anyone may open without logging in.
PUBLIC = {"login", "admin:login"}
