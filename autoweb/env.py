"""Read settings from environment variables, failing loudly on values that do not parse.

A typo such as ``DEBUG=flase`` or ``AUTOWEB_SANDBOX_TIMEOUT_S=5m`` stops the process at startup
with the variable's name, instead of silently falling back to a default.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def envstr(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean: use one of {', '.join(sorted(_TRUE | _FALSE))}"
    )


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum of {minimum}")
    return value


def envlist(name: str, default: list[str], *, sep: str = ",") -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(sep) if item.strip()]


def parse_prices(raw: str, name: str) -> dict[str, tuple[float, float]]:
    """ "gpt-4o=2.5:10,qwen=0:0" -> {model: (USD per M input tokens, per M output tokens)}."""
    prices: dict[str, tuple[float, float]] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        model, sep, rates = item.strip().rpartition("=")
        parts = rates.split(":")
        try:
            if not sep or not model or len(parts) != 2:
                raise ValueError
            pin, pout = float(parts[0]), float(parts[1])
            if pin < 0 or pout < 0:
                raise ValueError
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {item.strip()!r} is not model=input_price:output_price "
                "(USD per million tokens)"
            ) from None
        prices[model] = (pin, pout)
    return prices


_POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql"}


def _redacted(url: str) -> str:
    """The URL with its password hidden, for error messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def parse_database_url(url: str, base_dir: Path) -> dict:
    """Turn ``postgres://user:pass@host:port/name?opt=v`` or ``sqlite:///path`` into a
    DATABASES entry.

    ``sqlite:///var/db.sqlite3`` is relative to ``base_dir``; ``sqlite:////abs/db.sqlite3`` is
    absolute; ``sqlite:///:memory:`` is an in-memory database.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        # No URL in the message: without a scheme, a password cannot be told apart to hide it.
        raise ImproperlyConfigured("DATABASE_URL has no scheme: use postgres:// or sqlite:///")
    scheme = scheme.lower()
    if scheme == "sqlite":
        if not rest.startswith("/"):
            raise ImproperlyConfigured(
                f"DATABASE_URL {url!r}: write sqlite URLs as sqlite:///relative/path or "
                "sqlite:////absolute/path"
            )
        path = unquote(rest[1:])
        if path in ("", ":memory:"):
            name: str | Path = ":memory:"
        else:
            name = Path(path) if path.startswith("/") else base_dir / path
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
    if scheme in _POSTGRES_SCHEMES:
        parts = urlsplit(url)
        db_name = unquote(parts.path.lstrip("/"))
        if not db_name:
            raise ImproperlyConfigured(f"DATABASE_URL {_redacted(url)!r} names no database")
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured(
                f"DATABASE_URL {_redacted(url)!r} has an invalid port"
            ) from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": db_name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {scheme!r} is not supported: use postgres:// or sqlite:///"
    )
