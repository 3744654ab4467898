"""The address check of custom LLM URLs, address by address, and the pinned transport's refusal
to go anywhere but the origin it checked."""

from __future__ import annotations

import ipaddress

import httpx2
import pytest

from searches.agent import netguard


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.8.9.10", "a loopback address"),
        ("::1", "a loopback address"),
        ("10.0.0.1", "a private address"),
        ("172.16.5.4", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd12:3456::1", "a private address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("169.254.170.2", "a cloud metadata address"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("100.100.100.200", "a cloud metadata address"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("0.0.0.0", "the unspecified address"),
        ("::", "the unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("100.64.0.1", "not a public address"),
        ("198.18.0.1", "a private address"),
        ("240.0.0.1", "a private address"),
        # IPv6 spellings of an IPv4 address are judged by the address they reach.
        ("::ffff:127.0.0.1", "a loopback address"),
        ("::ffff:169.254.169.254", "a cloud metadata address"),
        ("2002:7f00:1::", "a loopback address"),  # 6to4 of 127.0.0.1
        ("2002:a00:1::", "a private address"),  # 6to4 of 10.0.0.1
        ("64:ff9b::a9fe:a9fe", "a cloud metadata address"),  # NAT64 of 169.254.169.254
    ],
)
def test_addresses_a_custom_url_may_not_reach(address, why):
    assert netguard.why_refused(ipaddress.ip_address(address)) == why


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2002:808:808::"]
)
def test_public_addresses_are_reachable(address):
    assert netguard.why_refused(ipaddress.ip_address(address)) is None


def test_every_address_a_host_resolves_to_is_checked_and_the_first_is_pinned():
    def resolver(host, port):
        return ["8.8.8.8", "10.0.0.5"]

    with pytest.raises(netguard.AddressRefused, match="resolves to 10.0.0.5, which is a private"):
        netguard.check("https://llm.example.com/v1", netguard.Allowlist(), resolver)
    allow = netguard.Allowlist.parse(["10.0.0.0/8"])
    checked = netguard.check("https://LLM.example.com/v1", allow, resolver)
    assert checked == netguard.Checked("https", "llm.example.com", 443, "8.8.8.8")


def test_a_host_that_does_not_resolve_is_not_an_address_error():
    def resolver(host, port):
        raise OSError("Name or service not known")

    with pytest.raises(netguard.Unresolvable, match="the host nowhere.example does not resolve"):
        netguard.check("http://nowhere.example/v1", netguard.Allowlist(), resolver)


def test_the_pinned_transport_goes_nowhere_but_the_checked_origin():
    transport = netguard.PinnedTransport(
        netguard.Checked("https", "llm.example.com", 443, "8.8.8.8")
    )
    with httpx2.Client(transport=transport) as client:
        for url in (
            "https://evil.example/v1/chat/completions",
            "http://llm.example.com/v1/chat/completions",  # another scheme
            "https://llm.example.com:8443/v1/chat/completions",  # another port
        ):
            with pytest.raises(httpx2.ConnectError, match="is not the endpoint checked"):
                client.get(url)


def test_the_header_hook_sends_only_the_endpoints_own_key_and_no_extra_headers():
    request = httpx2.Request(
        "POST",
        "https://llm.example.com/v1/chat/completions",
        headers={
            "Authorization": "Bearer server-key",
            "OpenAI-Organization": "org-1",
            "X-Gateway-Token": "server-key",
            "X-Stainless-Lang": "python",
            "Content-Type": "application/json",
        },
    )
    netguard.own_headers_only("")(request)
    assert "authorization" not in request.headers and "x-gateway-token" not in request.headers
    assert "openai-organization" not in request.headers
    assert request.headers["x-stainless-lang"] == "python"
    assert request.headers["host"] == "llm.example.com"
    netguard.own_headers_only("own-key")(request)
    assert request.headers["authorization"] == "Bearer own-key"
