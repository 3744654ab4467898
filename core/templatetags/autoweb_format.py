"""Number formatting for the pages. Missing values show as a dash, never as "None"."""

from __future__ import annotations

import math
from typing import Any

from django import template

register = template.Library()

DASH = "—"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _shown(value: Any, fmt: str, suffix: str = "") -> str:
    number = _number(value)
    if number is None:
        # A report may hold "NaN" or "Infinity" as text (JSON has no such numbers): show it.
        return str(value) if isinstance(value, str) and value else DASH
    if not math.isfinite(number):
        return str(number)
    return format(number, fmt) + suffix


@register.filter
def num(value: Any, digits: int = 4) -> str:
    return _shown(value, f".{int(digits)}g")


@register.filter
def ms(value: Any) -> str:
    return _shown(value, ".4g", " ms")


@register.filter
def us(value: Any) -> str:
    return _shown(value, ".3g", " µs")


@register.filter
def speedup(value: Any) -> str:
    return _shown(value, ".2f", "×")


@register.filter
def pct(value: Any) -> str:
    number = _number(value)
    return _shown(None if number is None else number * 100, ".1f", "%")


@register.filter
def age(seconds: Any) -> str:
    """Seconds as a short age: 4 s, 3 min, 2 h, 5 d."""
    number = _number(seconds)
    if number is None:
        return DASH
    number = max(0.0, number)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if number >= size:
            return f"{number / size:.0f} {unit}"
    return f"{number:.0f} s"
