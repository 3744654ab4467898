"""Where a base URL typed by a user may send requests, and a transport that sends them only
there.

A custom URL's host is resolved and every address it resolves to must be public: loopback,
link-local, private, shared, reserved and cloud metadata addresses are refused unless the
operator's allowlist names the host or a network holding the address. The request then
connects to the address that was checked (the URL's host is swapped for it, while the `Host`
header and the TLS server name stay the host name, so certificates are still verified against
it): a DNS answer that changes after the check (DNS rebinding) is never used.

`own_headers_only` lets through only the headers a chat completion needs, with the endpoint's
own key or none: what the openai client adds from the server's environment (`OPENAI_ORG_ID`,
`OPENAI_PROJECT_ID`, `OPENAI_CUSTOM_HEADERS`, which may hold a gateway's credentials) stays on
the server.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx2

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

# Cloud instance metadata services (AWS, GCP, Azure; AWS over IPv6; Alibaba; Oracle). Most are
# link-local or otherwise not global anyway; named so that the error says what they are.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
_SENT_HEADERS = frozenset(
    {
        "host",
        "accept",
        "accept-encoding",
        "connection",
        "content-type",
        "content-length",
        "user-agent",
        "idempotency-key",
    }
)


class AddressRefused(Exception):
    """The URL's host resolves to an address it may not reach; the message says which and why."""


class Unresolvable(Exception):
    """The URL's host does not resolve (now: DNS may answer later)."""


def why_refused(ip: IPAddress) -> str | None:
    """Why a custom URL may not reach `ip`, or None for a public address."""
    if ip in METADATA:
        return "a cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address):
        # IPv6 forms that carry an IPv4 address: judged by the address they reach.
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in ipaddress.ip_network("64:ff9b::/96"):  # NAT64
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return why_refused(embedded)
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "not a public address"
    return None


@dataclass(frozen=True)
class Allowlist:
    """Hosts and networks the operator lets custom URLs reach although they are not public."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def parse(cls, items: Iterable[str]) -> Allowlist:
        hosts, networks = set(), []
        for item in items:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                hosts.add(item.lower())
        return cls(frozenset(hosts), tuple(networks))

    def allows(self, host: str, ip: IPAddress) -> bool:
        return host.lower() in self.hosts or any(ip in net for net in self.networks)


@dataclass(frozen=True)
class Checked:
    """A URL's origin and the address its requests connect to."""

    scheme: str
    host: str
    port: int
    ip: str


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def check(url: str, allow: Allowlist, resolver: Resolver = resolve) -> Checked:
    """Resolve the URL's host once and check every address; the first one is the one to use."""
    parts = httpx2.URL(url)  # the host as the client will send it (IDNA-encoded, lower case)
    host = parts.host
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolver(host, port)
    except (OSError, UnicodeError):
        raise Unresolvable(f"the host {host} does not resolve") from None
    if not addresses:
        raise Unresolvable(f"the host {host} does not resolve")
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])  # an IPv6 zone is no part of the check
        if allow.allows(host, ip):
            continue
        reason = why_refused(ip)
        if reason is not None:
            shown = host if host == str(ip) else f"{host} resolves to {ip}, which is"
            raise AddressRefused(
                f"{shown} {reason}: a custom URL must reach a public address, unless the "
                "server's AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST names it"
            )
    return Checked(parts.scheme, host, port, addresses[0])


def own_headers_only(api_key: str) -> Callable[[httpx2.Request], None]:
    """A request hook: only the headers a completion needs, and the endpoint's own key (none:
    no Authorization header at all), whatever the client put there."""

    def hook(request: httpx2.Request) -> None:
        for name in list(request.headers.keys()):
            lower = name.lower()
            if lower == "authorization" or (
                lower not in _SENT_HEADERS and not lower.startswith("x-stainless-")
            ):
                del request.headers[name]
        if api_key:
            request.headers["Authorization"] = f"Bearer {api_key}"

    return hook


class PinnedTransport(httpx2.BaseTransport):
    """Sends requests only to the checked origin, connecting to its checked address."""

    def __init__(self, checked: Checked) -> None:
        self.checked = checked
        self.inner = httpx2.HTTPTransport(trust_env=False)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        c, url = self.checked, request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        if (url.scheme, url.host, port) != (c.scheme, c.host, c.port):
            raise httpx2.ConnectError(
                f"refused: {url.scheme}://{url.host}:{port} is not the endpoint checked",
                request=request,
            )
        # The Host header was set from the URL when the request was built, so it keeps the host
        # name; the TLS handshake names it too, and the certificate is verified against it.
        request.url = url.copy_with(host=c.ip)
        request.extensions = {**request.extensions, "sni_hostname": c.host}
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()
