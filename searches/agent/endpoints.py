"""Where an LLM search's requests go, and with which key.

The operator declares the endpoints: "default" is OPENAI_BASE_URL with OPENAI_API_KEY, and
AUTOWEB_LLM_ENDPOINTS adds more, each with its own key. Ideas and searches name one of them. A
base URL typed by a user (a "custom" endpoint) is accepted only when AUTOWEB_LLM_ALLOW_CUSTOM_URL
is on, must reach public addresses (or the allowlist), and gets only the key typed with it: a
server key never goes to a URL the operator did not declare.

An idea or search stores its target in two fields: `llm_base_url` (a custom URL, else blank)
and `llm_endpoint` (a declared name; blank is "default"). Its own key, if any, is in
`llm_api_key`, encrypted (searches/crypto.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from autoweb.env import RESERVED_ENDPOINTS, base_url_problem
from searches import crypto
from searches.agent import llm, netguard

DEFAULT, CUSTOM = RESERVED_ENDPOINTS
MAX_URL = 500
MAX_KEY = 500


@dataclass(frozen=True)
class Declared:
    name: str
    base_url: str  # blank: the openai client's default (api.openai.com)
    api_key: str  # never shown

    def __repr__(self) -> str:  # never the key
        return f"Declared(name={self.name!r}, base_url={self.base_url!r})"

    @property
    def where(self) -> str:
        if not self.base_url:
            return "api.openai.com"
        parts = urlsplit(self.base_url)
        return parts.netloc


def declared() -> dict[str, Declared]:
    """Every endpoint the operator declared, "default" first."""
    found = {DEFAULT: Declared(DEFAULT, settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY)}
    for name, entry in settings.AUTOWEB_LLM_ENDPOINTS.items():
        found[name] = Declared(name, entry["base_url"], entry["api_key"])
    return found


def custom_allowed() -> bool:
    return bool(settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL)


def allowlist() -> netguard.Allowlist:
    return netguard.Allowlist.parse(settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST)


@dataclass(frozen=True)
class Target:
    """A declared endpoint by name, or a custom URL."""

    name: str = DEFAULT  # CUSTOM for a URL typed by a user
    url: str = ""

    @property
    def custom(self) -> bool:
        return self.name == CUSTOM

    @property
    def fields(self) -> dict[str, str]:
        """The values of `llm_endpoint` and `llm_base_url` that store this target."""
        if self.custom:
            return {"llm_endpoint": "", "llm_base_url": self.url}
        return {"llm_endpoint": self.name, "llm_base_url": ""}

    def __str__(self) -> str:
        return f"custom URL {self.url}" if self.custom else self.name


def target_of(row: Any) -> Target:
    """The target an idea or a search stores."""
    if row.llm_base_url:
        return Target(CUSTOM, row.llm_base_url)
    return Target(row.llm_endpoint or DEFAULT)


def choices() -> list[tuple[str, str]]:
    """The endpoints the forms offer, by name (and where they are)."""
    offered = [(name, f"{name} ({d.where})") for name, d in declared().items()]
    if custom_allowed():
        offered.append((CUSTOM, "custom URL (type it below; it gets only the key typed with it)"))
    return offered


def clean_target(
    endpoint: str | None,
    base_url: str | None,
    bad: Callable[[str, str], None],
    current: Target | None = None,
) -> Target | None:
    """The target a form or API call asks for (None: not given), or errors through `bad`
    ("llm_endpoint" / "base_url"). "custom" without a URL keeps the `current` custom URL. A
    typed URL's address is checked here, so that a refused one is a form error; it is checked
    again before every request."""
    endpoint = (endpoint or "").strip() if isinstance(endpoint, str) else endpoint
    base_url = (base_url or "").strip() if isinstance(base_url, str) else base_url
    if endpoint is not None and not isinstance(endpoint, str):
        bad("llm_endpoint", "Name the endpoint as a string.")
        return None
    if base_url is not None and not isinstance(base_url, str):
        bad("base_url", "Give the base URL as a string.")
        return None
    known = declared()
    if base_url:
        if endpoint and endpoint != CUSTOM:
            bad(
                "base_url",
                f"A typed URL goes with the endpoint 'custom', not {endpoint!r}: choose one.",
            )
            return None
        return _clean_custom(base_url, bad)
    if endpoint == CUSTOM:
        if current is not None and current.custom and custom_allowed():
            return None  # unchanged: the URL it has, not typed again
        if not custom_allowed():
            bad("llm_endpoint", _custom_off(known))
        else:
            bad("base_url", "Type the custom endpoint's base URL, e.g. https://llm.example.com/v1.")
        return None
    if not endpoint:
        return None
    if endpoint not in known:
        bad("llm_endpoint", f"Unknown endpoint {endpoint!r}; this server has {_names(known)}.")
        return None
    return Target(endpoint)


def _names(known: dict[str, Declared]) -> str:
    return ", ".join(known)


def _custom_off(known: dict[str, Declared]) -> str:
    return (
        "This server does not accept typed base URLs (AUTOWEB_LLM_ALLOW_CUSTOM_URL is off): "
        f"choose one of its endpoints: {_names(known)}."
    )


def _clean_custom(url: str, bad: Callable[[str, str], None]) -> Target | None:
    if not custom_allowed():
        bad("base_url", _custom_off(declared()))
        return None
    problem = "it is too long" if len(url) > MAX_URL else base_url_problem(url)
    if problem:
        bad(
            "base_url",
            f"This base URL is refused: {problem}. A base URL is http(s)://host[:port]/path, "
            "e.g. https://llm.example.com/v1.",
        )
        return None
    try:
        netguard.check(url, allowlist())
    except (netguard.AddressRefused, netguard.Unresolvable) as e:
        bad("base_url", f"This base URL is refused: {e}.")
        return None
    return Target(CUSTOM, url)


def clean_key(api_key: Any, bad: Callable[[str, str], None]) -> str:
    if api_key is None or api_key == "":
        return ""
    if not isinstance(api_key, str) or len(api_key) > MAX_KEY or any(c.isspace() for c in api_key):
        bad("api_key", f"An API key is one word of at most {MAX_KEY} characters.")
        return ""
    return api_key


def endpoint_for(row: Any, model: str) -> llm.Endpoint:
    """Where a search's next request goes, with which key. `LLMFatal` when its endpoint no
    longer exists here or its key cannot be read: the search stops with that."""
    try:
        own = crypto.decrypt(row.llm_api_key)
    except crypto.KeyUnreadable as e:
        raise llm.LLMFatal(f"{e}: set the key again on the search page") from None
    target = target_of(row)
    if target.custom:
        if not custom_allowed():
            raise llm.LLMFatal(
                f"the search's custom URL is no longer allowed on this server "
                f"(AUTOWEB_LLM_ALLOW_CUSTOM_URL is off): {_custom_off(declared())}"
            )
        return llm.Endpoint(
            model=model, base_url=target.url, api_key=own, kind=llm.CUSTOM, allow=allowlist()
        )
    known = declared()
    entry = known.get(target.name)
    if entry is None:
        raise llm.LLMFatal(
            f"the endpoint {target.name!r} is no longer declared on this server; switch the "
            f"search to one of {_names(known)}"
        )
    return llm.Endpoint(
        model=model,
        base_url=entry.base_url,
        api_key=own or entry.api_key,
        kind=llm.DEFAULT if entry.name == DEFAULT else llm.DECLARED,
    )
