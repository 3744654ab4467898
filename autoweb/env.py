"""Read settings from environment variables, failing loudly on values that do not parse.

A typo such as ``DEBUG=flase`` or ``AUTOWEB_SANDBOX_TIMEOUT_S=5m`` stops the process at startup
with the variable's name, instead of silently falling back to a default.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
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


# -- secrets at rest ---------------------------------------------------------------------------

_NEW_FERNET_KEY = (
    "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
)


def parse_fernet_keys(raw: str, name: str) -> list[str]:
    """Comma-separated Fernet keys (the first encrypts, all decrypt). A bad one is named by its
    position, never by its value."""
    from cryptography.fernet import Fernet

    keys = [item.strip() for item in raw.split(",") if item.strip()]
    for position, key in enumerate(keys, 1):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ImproperlyConfigured(
                f"{name}: key {position} of {len(keys)} is not a Fernet key (32 url-safe "
                f"base64-encoded bytes); make one with {_NEW_FERNET_KEY}"
            ) from None
    return keys


def encryption_keys(raw: str, name: str, *, debug: bool, secret_key: str) -> list[str]:
    """The keys for secrets at rest. Required with DEBUG off; with DEBUG on and none set, one
    derived from SECRET_KEY, so a development database stays readable across restarts."""
    keys = parse_fernet_keys(raw, name)
    if keys:
        return keys
    if not debug:
        raise ImproperlyConfigured(
            f"{name} must be set when DEBUG is off: it encrypts the API keys stored in the "
            f"database. Make a key with {_NEW_FERNET_KEY}"
        )
    digest = hashlib.sha256(f"autoweb development encryption key:{secret_key}".encode()).digest()
    return [base64.urlsafe_b64encode(digest).decode("ascii")]


# -- LLM endpoints -----------------------------------------------------------------------------

RESERVED_ENDPOINTS = ("default", "custom")  # the OPENAI_* entry; a URL a user typed
_ENDPOINT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def base_url_problem(url: str) -> str | None:
    """Why `url` cannot be an LLM base URL, or None. The message never repeats the URL (it
    may hold a password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError:
        return "it is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it is not http(s)://host[:port]/path"
    if parts.username or parts.password:
        return "it carries credentials: keys go in the API key, never in the URL"
    if parts.query or parts.fragment:
        return "it has a query string or fragment: keys go in the API key, never in the URL"
    return None


def parse_llm_endpoints(raw: str, name: str) -> dict[str, dict[str, str]]:
    """ "vllm=http://vllm.internal:8001/v1 VLLM_KEY, gw=https://gw.example.com/v1 GW_KEY" ->
    {endpoint: {"base_url", "key_variable", "api_key"}}; the key is read from the variable named
    (none named: no key). A key variable that is not set stops the process."""
    endpoints: dict[str, dict[str, str]] = {}
    items = [item.strip() for item in raw.split(",") if item.strip()]
    for position, item in enumerate(items, 1):
        endpoint, sep, rest = item.partition("=")
        endpoint = endpoint.strip()
        words = rest.split()
        if not sep or not _ENDPOINT_NAME.match(endpoint) or len(words) not in (1, 2):
            # Named by position: the entry may hold a URL with a password.
            raise ImproperlyConfigured(
                f"{name}: entry {position} is not name=URL [KEY_VARIABLE] (a lower-case name, "
                "the base URL, then the name of the variable holding its key)"
            )
        if endpoint in RESERVED_ENDPOINTS:
            raise ImproperlyConfigured(
                f"{name}: the name {endpoint!r} is reserved ('default' is OPENAI_BASE_URL with "
                "OPENAI_API_KEY; 'custom' is a URL a user typed)"
            )
        if endpoint in endpoints:
            raise ImproperlyConfigured(f"{name}: the endpoint {endpoint!r} is declared twice")
        problem = base_url_problem(words[0])
        if problem:
            raise ImproperlyConfigured(f"{name}: the URL of {endpoint!r} is refused: {problem}")
        variable = words[1] if len(words) == 2 else ""
        if variable and not _ENV_NAME.match(variable):
            raise ImproperlyConfigured(
                f"{name}: {variable!r} (the key of {endpoint!r}) is not a variable name"
            )
        if variable and variable not in os.environ:
            raise ImproperlyConfigured(
                f"{name}: the endpoint {endpoint!r} takes its key from {variable}, which is not set"
            )
        endpoints[endpoint] = {
            "base_url": words[0],
            "key_variable": variable,
            "api_key": os.environ.get(variable, "") if variable else "",
        }
    return endpoints


def parse_host_allowlist(items: list[str], name: str) -> list[str]:
    """Host names and IP networks (`10.0.0.0/8`, `127.0.0.1`, `vllm.internal`), lower-cased."""
    allowed = []
    for item in items:
        value = item.strip().lower()
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            if not _HOST_NAME.fullmatch(value):
                raise ImproperlyConfigured(
                    f"{name}: {item!r} is neither a host name nor an IP address or network"
                ) from None
        allowed.append(value)
    return allowed
