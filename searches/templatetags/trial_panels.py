"""The panels apps built on `searches` add to the trial page (`searches.hooks`)."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from searches import hooks

register = template.Library()


@register.simple_tag
def trial_panels(trial: Any) -> SafeString:
    # Each panel is rendered by its app from its own template, so it is escaped there.
    return mark_safe("".join(hooks.trial_panels(trial)))  # noqa: S308
