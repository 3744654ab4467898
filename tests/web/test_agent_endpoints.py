"""Where the server's LLM keys go, proved with real local servers that log every request's
headers: the default endpoint gets the server key, a declared endpoint its own, a custom URL
only the key typed with it (or none), before or after a switch. Who may switch, the record of
each change, and the address check of custom URLs (with the connection pinned to the address
checked)."""

from __future__ import annotations

import socket

import pytest
from django.core.exceptions import PermissionDenied
from django.urls import reverse

from core.roles import ENGINEERS
from searches import crypto, services
from searches.agent import step
from searches.agent.switch import set_llm
from searches.models import Idea, LLMChange, Search, Trial
from tests.web.agent_helpers import GOOD, WRONG, fenced, llm_search
from tests.web.conftest import _user
from tests.web.domain import judge, rejected
from tests.web.openai_server import OpenAIServer, Step

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

SERVER_KEY = "sk-test-secret-key-0123456789"  # the llm_server fixture's OPENAI_API_KEY
GATEWAY_KEY = "gw-declared-key-4242"
OWN_KEY = "sk-live-never-show-me-123456"
NEW_KEY = "own-key-typed-later-77"


def _fill(search: Search) -> list[Trial]:
    queued: list[Trial] = []
    step.fill(Search.objects.get(pk=search.pk), "interpret", capacity=1, enqueue=queued.append)
    return queued


def _headers(server: OpenAIServer) -> list[dict[str, str]]:
    return [r["_headers"] for r in server.requests]


@pytest.fixture
def other_server():
    """A second OpenAI-compatible server: a declared gateway or a URL an engineer types."""
    with OpenAIServer() as server:
        server.script.add(Step(reply=fenced(GOOD)))
        yield server


@pytest.fixture
def custom_urls(settings):
    """Typed URLs allowed; the test servers listen on loopback, so 127.0.0.1 is allowlisted."""
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST = ["127.0.0.1"]


@pytest.fixture
def server_env(monkeypatch):
    """What an operator's environment holds for the default endpoint: the openai client would
    read each of these by itself, for whatever URL it is pointed at."""
    monkeypatch.setenv("OPENAI_API_KEY", SERVER_KEY)
    monkeypatch.setenv("OPENAI_ORG_ID", "org-server-only")
    monkeypatch.setenv(
        "OPENAI_CUSTOM_HEADERS",
        f"Authorization: Bearer {SERVER_KEY}\nX-Gateway-Token: {SERVER_KEY}",
    )


def _no_server_secret(headers: dict[str, str]) -> None:
    assert SERVER_KEY not in str(headers), headers
    assert "org-server-only" not in str(headers), headers


# -- where keys go ---------------------------------------------------------------------------------


def test_the_server_key_reaches_the_default_endpoint(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD)))
    [trial] = _fill(llm_search(engineer))
    assert trial.model == "model-a"
    assert llm_server.requests[0]["_headers"]["authorization"] == f"Bearer {SERVER_KEY}"


def test_a_declared_endpoint_gets_its_own_key_and_nothing_of_the_default_ones(
    engineer, llm_server, other_server, settings, server_env
):
    settings.AUTOWEB_LLM_ENDPOINTS = {
        "gateway": {"base_url": other_server.base_url, "api_key": GATEWAY_KEY}
    }
    search = llm_search(engineer, llm_endpoint="gateway")
    [trial] = _fill(search)
    assert trial.model == "model-a" and llm_server.requests == []
    [headers] = _headers(other_server)
    assert headers["authorization"] == f"Bearer {GATEWAY_KEY}"
    _no_server_secret(headers)
    assert "x-gateway-token" not in headers and "openai-organization" not in headers


def test_the_server_key_never_reaches_a_custom_url_from_the_idea_on(
    engineer, llm_server, other_server, custom_urls, server_env
):
    search = llm_search(engineer, llm_endpoint="custom", llm_base_url=other_server.base_url)
    [trial] = _fill(search)
    assert trial.model == "model-a" and llm_server.requests == []
    [headers] = _headers(other_server)
    assert "authorization" not in headers  # no key typed: no key at all
    _no_server_secret(headers)


def test_the_server_key_never_reaches_a_custom_url_after_a_switch(
    engineer, llm_server, other_server, custom_urls, server_env
):
    llm_server.script.add(Step(reply=fenced(WRONG)))
    search = llm_search(engineer)
    [first] = _fill(search)  # the default endpoint, with the server key
    assert llm_server.requests[0]["_headers"]["authorization"] == f"Bearer {SERVER_KEY}"
    judge(first, rejected("incorrect"))  # nothing in flight, nothing to tune: the model's turn
    set_llm(search=search, user=engineer, model="model-b", base_url=other_server.base_url)
    [trial] = _fill(search)
    assert trial.model == "model-b" and len(llm_server.requests) == 1
    [headers] = _headers(other_server)
    assert "authorization" not in headers
    _no_server_secret(headers)


def test_a_switched_url_without_a_new_key_sends_no_key_at_all(
    engineer, llm_server, other_server, custom_urls, server_env
):
    with OpenAIServer() as first:
        first.script.add(Step(reply=fenced(GOOD)))
        search = llm_search(
            engineer, llm_endpoint="custom", llm_base_url=first.base_url, llm_api_key=OWN_KEY
        )
        [trial] = _fill(search)
        assert first.requests[0]["_headers"]["authorization"] == f"Bearer {OWN_KEY}"
    judge(trial, rejected("incorrect"))
    set_llm(search=search, user=engineer, model="model-a", base_url=other_server.base_url)
    search.refresh_from_db()
    assert search.llm_api_key == ""  # the key typed for the first URL was not carried over
    _fill(search)
    [headers] = _headers(other_server)
    assert "authorization" not in headers and OWN_KEY not in str(headers)
    _no_server_secret(headers)
    [change] = search.llm_changes.all()
    assert (change.to_endpoint, change.key) == (f"custom URL {other_server.base_url}", "cleared")


def test_a_new_key_typed_with_the_switch_is_the_only_key_the_new_url_gets(
    engineer, llm_server, other_server, custom_urls, server_env
):
    search = llm_search(engineer, llm_api_key=OWN_KEY)  # own key on the default endpoint
    set_llm(
        search=search,
        user=engineer,
        model="model-a",
        endpoint="custom",
        base_url=other_server.base_url,
        api_key=NEW_KEY,
    )
    _fill(search)
    [headers] = _headers(other_server)
    assert headers["authorization"] == f"Bearer {NEW_KEY}"
    assert OWN_KEY not in str(headers)
    _no_server_secret(headers)
    assert search.llm_changes.get().key == LLMChange.Key.NEW


def test_moving_between_declared_endpoints_clears_the_own_key_too(
    engineer, llm_server, other_server, settings
):
    settings.AUTOWEB_LLM_ENDPOINTS = {
        "gateway": {"base_url": other_server.base_url, "api_key": GATEWAY_KEY}
    }
    search = llm_search(engineer, llm_api_key=OWN_KEY)
    set_llm(search=search, user=engineer, model="model-a", endpoint="gateway")
    _fill(search)
    [headers] = _headers(other_server)
    assert headers["authorization"] == f"Bearer {GATEWAY_KEY}"  # the gateway's, not the own key


def test_a_model_switch_on_the_same_endpoint_keeps_the_own_key(engineer, llm_server):
    llm_server.script.add(Step(reply=fenced(GOOD)))
    search = llm_search(engineer, llm_api_key=OWN_KEY)
    set_llm(search=search, user=engineer, model="model-b")
    search.refresh_from_db()
    assert crypto.decrypt(search.llm_api_key) == OWN_KEY
    _fill(search)
    assert llm_server.requests[0]["_headers"]["authorization"] == f"Bearer {OWN_KEY}"
    assert search.llm_changes.get().key == LLMChange.Key.UNCHANGED


def test_an_endpoint_no_longer_declared_or_allowed_stops_the_search_before_any_request(
    engineer, llm_server, other_server, settings, custom_urls
):
    settings.AUTOWEB_LLM_ENDPOINTS = {"gateway": {"base_url": other_server.base_url, "api_key": ""}}
    gone = llm_search(engineer, llm_endpoint="gateway")
    custom = llm_search(engineer, llm_endpoint="custom", llm_base_url=other_server.base_url)
    settings.AUTOWEB_LLM_ENDPOINTS = {}
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = False
    assert _fill(gone) == [] and _fill(custom) == []
    gone.refresh_from_db()
    custom.refresh_from_db()
    assert gone.status == custom.status == Search.Status.FAILED
    assert "'gateway' is no longer declared" in gone.stop_reason
    assert "AUTOWEB_LLM_ALLOW_CUSTOM_URL is off" in custom.stop_reason
    assert other_server.requests == [] and llm_server.requests == []


# -- who may switch --------------------------------------------------------------------------------


@pytest.fixture
def other_engineer(django_user_model):
    return _user(django_user_model, "bob", ENGINEERS)


@pytest.fixture
def staff(django_user_model):
    return _user(django_user_model, "root", is_staff=True, is_superuser=True)


def test_another_engineer_cannot_switch_someone_elses_search(
    client, engineer, other_engineer, custom_urls
):
    search = llm_search(engineer, llm_api_key=OWN_KEY)
    client.force_login(other_engineer)
    url = reverse("searches:search_llm", args=[search.pk])
    for data in (
        {"model": "model-b"},
        {"model": "model-b", "llm_endpoint": "custom", "base_url": "http://127.0.0.1:9/v1"},
        {"model": "bad model"},  # refused before the form says anything about it
    ):
        r = client.post(url, data)
        assert r.status_code == 403, data
        assert "owner, a reviewer or staff may change its model" in r.content.decode()
    with pytest.raises(PermissionDenied, match="owner, a reviewer"):
        set_llm(search=search, user=other_engineer, model="model-b")
    search.refresh_from_db()
    assert (search.model, search.llm_base_url) == ("", "")
    assert crypto.decrypt(search.llm_api_key) == OWN_KEY
    assert not LLMChange.objects.exists()
    page = client.get(reverse("searches:search", args=[search.pk])).content.decode()
    assert 'id="llm-form"' not in page and 'id="llm-steer-note"' in page


@pytest.mark.parametrize("who", ["engineer", "reviewer", "staff"])
def test_the_owner_a_reviewer_and_staff_can_switch_and_the_change_is_recorded(
    client, engineer, reviewer, staff, who
):
    user = {"engineer": engineer, "reviewer": reviewer, "staff": staff}[who]
    search = llm_search(engineer)
    client.force_login(user)
    r = client.post(
        reverse("searches:search_llm", args=[search.pk]), {"model": "model-b", "api_key": NEW_KEY}
    )
    assert r.status_code == 302
    search.refresh_from_db()
    assert search.model == "model-b" and crypto.decrypt(search.llm_api_key) == NEW_KEY
    change = search.llm_changes.get()
    assert (change.changed_by, change.from_model, change.to_model) == (user, "model-a", "model-b")
    assert (change.from_endpoint, change.to_endpoint, change.key) == ("default", "default", "new")
    page = client.get(reverse("searches:search", args=[search.pk])).content.decode()
    table = page[page.index('id="llm-change-table"') :].split("</table>")[0]
    assert user.username in table and "model-a → model-b" in table and "new key" in table
    assert NEW_KEY not in page and NEW_KEY not in str(
        list(LLMChange.objects.values())
    )  # the record never holds the key


# -- the address check of custom URLs --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:8001/v1", "127.0.0.1 a loopback address"),
        ("http://localhost:8001/v1", "which is a loopback address"),
        ("http://[::1]:8001/v1", "a loopback address"),
        ("http://2130706433/v1", "127.0.0.1, which is a loopback address"),  # 127.0.0.1 as one int
        ("http://[::ffff:127.0.0.1]/v1", "a loopback address"),
        ("http://10.1.2.3/v1", "a private address"),
        ("http://192.168.0.10/v1", "a private address"),
        ("http://169.254.169.254/latest/meta-data", "a cloud metadata address"),
        ("http://[fd00:ec2::254]/v1", "a cloud metadata address"),
        ("http://100.100.100.200/v1", "a cloud metadata address"),
        ("http://169.254.10.1/v1", "a link-local address"),
        ("http://0.0.0.0:8001/v1", "the unspecified address"),
        ("http://100.64.1.1/v1", "not a public address"),
        ("http://no-such-host.invalid/v1", "does not resolve"),
    ],
)
def test_a_custom_url_to_a_private_address_is_refused_with_a_clear_form_error(
    engineer_client, engineer, settings, url, why
):
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    search = llm_search(engineer)
    r = engineer_client.post(
        reverse("searches:search_llm", args=[search.pk]),
        {"model": "model-a", "llm_endpoint": "custom", "base_url": url, "api_key": NEW_KEY},
    )
    assert r.status_code == 400
    html = r.content.decode()
    field = html[html.index('id="field-base_url"') :].split("</div>")[0]
    assert "This base URL is refused" in field and why in field, field
    search.refresh_from_db()
    assert (search.llm_base_url, search.llm_api_key) == ("", "")
    assert not LLMChange.objects.exists()


@pytest.mark.parametrize("allow", ["127.0.0.1", "127.0.0.0/8", "localhost"])
def test_an_allowlisted_private_url_is_accepted(engineer_client, engineer, settings, allow):
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST = [allow]
    url = "http://localhost:8001/v1" if allow == "localhost" else "http://127.0.0.1:8001/v1"
    search = llm_search(engineer)
    r = engineer_client.post(
        reverse("searches:search_llm", args=[search.pk]),
        {"model": "model-a", "llm_endpoint": "custom", "base_url": url},
    )
    assert r.status_code == 302, r.content.decode()
    search.refresh_from_db()
    assert search.llm_base_url == url


def test_the_idea_form_offers_endpoints_by_name_and_refuses_a_private_url(
    engineer_client, settings, llm_server
):
    settings.AUTOWEB_LLM_ENDPOINTS = {
        "gateway": {"base_url": "https://gw.example.com/v1", "api_key": GATEWAY_KEY}
    }
    html = engineer_client.get(reverse("searches:idea_new")).content.decode()
    assert '<option value="default"' in html and '<option value="gateway"' in html
    assert "gateway (gw.example.com)" in html
    assert 'value="custom"' not in html and 'name="llm_base_url"' not in html  # off by default
    assert GATEWAY_KEY not in html
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    html = engineer_client.get(reverse("searches:idea_new")).content.decode()
    assert '<option value="custom"' in html and 'name="llm_base_url"' in html
    data = {
        "title": "private",
        "problem": "softmax",
        "target_kinds": ["interpret"],
        "start_anyway": "on",  # no worker online in this test
        "proposer": "llm:other",
        "llm_model": "model-a",
        "llm_endpoint": "custom",
        "llm_base_url": "http://10.0.0.7:8000/v1",
        "max_trials": 5,
        "max_gpu_minutes": 5,
        "max_wall_minutes": 5,
    }
    r = engineer_client.post(reverse("searches:idea_new"), data)
    assert r.status_code == 400
    html = r.content.decode()
    field = html[html.index('id="field-llm_base_url"') :].split("</div>")[0]
    assert "10.0.0.7 a private address" in field
    settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST = ["10.0.0.0/8"]
    r = engineer_client.post(reverse("searches:idea_new"), {**data, "llm_api_key": OWN_KEY})
    assert r.status_code == 302
    idea = Idea.objects.get(title="private")
    assert (idea.llm_endpoint, idea.llm_base_url) == ("", "http://10.0.0.7:8000/v1")
    assert crypto.decrypt(idea.llm_api_key) == OWN_KEY and OWN_KEY not in idea.llm_api_key
    page = engineer_client.get(reverse("searches:idea", args=[idea.pk])).content.decode()
    assert "custom URL http://10.0.0.7:8000/v1" in page and OWN_KEY not in page


def test_an_ideas_key_goes_only_to_searches_its_author_starts(engineer, other_engineer):
    kwargs = {"llm_endpoint": "default", "llm_api_key": OWN_KEY}
    search = llm_search(engineer, **kwargs)
    assert crypto.decrypt(search.llm_api_key) == OWN_KEY
    theirs = services.start_search(idea=search.idea, user=other_engineer, seed=1)
    assert theirs.llm_api_key == "" and theirs.llm_endpoint == "default"


@pytest.fixture
def rebinding_dns(monkeypatch):
    """A DNS that answers "llm.rebind.test" with a loopback address first, then with the cloud
    metadata address: what an attacker's name server does to get past a check."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host, port, *args, **kw):
        if host != "llm.rebind.test":
            return real(host, port, *args, **kw)
        asked.append(host)
        ip = "127.0.0.1" if len(asked) == 1 else "169.254.169.254"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_the_request_connects_to_the_address_checked_not_to_a_later_dns_answer(
    engineer, llm_server, other_server, settings, rebinding_dns
):
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST = ["127.0.0.1"]
    port = other_server.httpd.server_address[1]
    url = f"http://llm.rebind.test:{port}/v1"
    search = llm_search(engineer)
    set_llm(search=search, user=engineer, model="model-a", base_url=url)  # checked: 1 lookup
    rebinding_dns.clear()
    [trial] = _fill(search)  # checked again: 127.0.0.1; a second lookup would be the metadata
    assert trial.model == "model-a"
    assert rebinding_dns == ["llm.rebind.test"]  # one lookup per attempt: the check's
    [headers] = _headers(other_server)
    assert headers["host"] == f"llm.rebind.test:{port}"  # the host name, not the address
    assert "authorization" not in headers


def test_a_custom_url_that_resolves_to_a_refused_address_later_stops_the_search_unsent(
    engineer, llm_server, settings, rebinding_dns
):
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST = ["127.0.0.1"]
    search = llm_search(engineer)
    set_llm(search=search, user=engineer, model="model-a", base_url="http://llm.rebind.test/v1")
    assert _fill(search) == []  # now it resolves to the metadata address
    search.refresh_from_db()
    assert search.status == Search.Status.FAILED
    assert "169.254.169.254, which is a cloud metadata address" in search.stop_reason
    assert llm_server.requests == []


def test_the_panel_form_switches_the_model_on_a_custom_url_without_retyping_it(
    engineer_client, engineer, custom_urls
):
    url = "http://127.0.0.1:9/v1"
    search = llm_search(engineer, llm_endpoint="custom", llm_base_url=url, llm_api_key=OWN_KEY)
    panel = reverse("searches:search_llm", args=[search.pk])
    form = engineer_client.get(panel).content.decode()
    assert '<option value="custom" selected>' in form and f'value="{url}"' not in form
    assert f"custom URL {url}" in form  # shown, not put back in the field
    r = engineer_client.post(panel, {"model": "model-b", "llm_endpoint": "custom", "base_url": ""})
    assert r.status_code == 302
    search.refresh_from_db()
    assert (search.model, search.llm_base_url) == ("model-b", url)
    assert crypto.decrypt(search.llm_api_key) == OWN_KEY
    r = engineer_client.post(panel, {"model": "model-b", "llm_endpoint": "default"})
    assert r.status_code == 302
    search.refresh_from_db()
    assert (search.llm_endpoint, search.llm_base_url, search.llm_api_key) == ("default", "", "")
    assert [c.key for c in search.llm_changes.order_by("pk")] == ["unchanged", "cleared"]
