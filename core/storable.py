"""JSON that both SQLite and PostgreSQL store, for every JSON field the apps write."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from core.errors import DomainError


def storable_json(value: Any, *, error: type[DomainError], depth: int = 0) -> Any:
    """`value` as JSON that both SQLite and PostgreSQL store: NaN and infinities become strings
    (jsonb rejects them; a report's error of "nan" is worth keeping), NUL bytes are escaped.
    Anything that is not JSON raises `error`."""
    if depth > 32:
        raise error("The JSON nests too deeply.")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return value.replace("\x00", "\\x00")
    if isinstance(value, Mapping):
        return {
            str(k).replace("\x00", "\\x00"): storable_json(v, error=error, depth=depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [storable_json(v, error=error, depth=depth + 1) for v in value]
    raise error(f"{type(value).__name__} is not JSON.")
