"""The agent's pages: the search page's LLM panel (model switch, per-model results, notes),
the prompt on the trial page, the idea form's LLM choices, and context packs."""

from __future__ import annotations

import pytest
from django.urls import reverse

from searches import crypto, services
from searches.agent import packs
from searches.models import ContextPack, Idea, Search, SearchNote
from tests.web.agent_helpers import GOOD, llm_search
from tests.web.domain import SOFTMAX_SEED, interpreted, judge, propose, rejected
from tests.web.pages import ROOT

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]
KEY = "sk-live-never-show-me-123456"


def _search_page(client, search) -> str:
    return client.get(reverse("searches:search", args=[search.pk])).content.decode()


def test_the_search_page_compares_models_and_breaks_failures_down(engineer_client, engineer):
    search = llm_search(engineer)
    a1 = propose(search, 1, proposer="llm:model-a", model="model-a", tokens_in=10, tokens_out=5)
    judge(a1, interpreted())
    a2 = propose(search, 2, proposer="llm:model-a", model="model-a")
    judge(a2, rejected("incorrect"))
    b1 = propose(search, 3, proposer="llm:model-b", model="model-b")
    judge(b1, rejected("compile_error"))
    t1 = propose(search, 4, proposer="tuner")
    judge(t1, interpreted())
    html = _search_page(engineer_client, search)
    panel = html[html.index('id="llm-panel"') :]
    assert 'id="current-model">model-a<' in panel
    row_a = panel[panel.index('data-model="model-a"') :].split("</tr>")[0]
    assert ">50.0%<" in row_a and "incorrect 1" in row_a and "10 / 5" in row_a
    row_b = panel[panel.index('data-model="model-b"') :].split("</tr>")[0]
    assert ">0.0%<" in row_b and "compile_error 1" in row_b
    assert 'data-proposer="tuner"' in panel


def test_switching_the_model_from_the_page_saves_it_and_never_shows_the_key(
    engineer_client, engineer, settings
):
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST = ["127.0.0.1"]
    search = llm_search(engineer)
    url = reverse("searches:search_llm", args=[search.pk])
    r = engineer_client.post(
        url,
        {
            "model": "model-b",
            "llm_endpoint": "custom",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key": KEY,
        },
    )
    assert r.status_code == 302
    search.refresh_from_db()
    assert (search.model, search.llm_endpoint, search.llm_base_url) == (
        "model-b",
        "",
        "http://127.0.0.1:9/v1",
    )
    assert KEY not in search.llm_api_key and crypto.decrypt(search.llm_api_key) == KEY
    html = _search_page(engineer_client, search)
    assert 'id="current-model">model-b<' in html and "key set for this search" in html
    assert KEY not in html and KEY not in str(search.to_dict())
    r = engineer_client.post(url, {"model": "model-c"}, HTTP_HX_REQUEST="true")
    search.refresh_from_db()
    assert r.status_code == 200 and search.model == "model-c"
    assert crypto.decrypt(search.llm_api_key) == KEY  # the same endpoint keeps its key
    assert KEY not in r.content.decode()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"model": "has spaces"}, "is not a model name"),
        ({"model": "m", "base_url": "ftp://x"}, "is not http(s)://host"),
        ({"model": "m", "base_url": "https://u:sk-1@x/v1"}, "keys go in the API key"),
        ({"model": "m", "base_url": "https://x.example/v1?key=sk-1"}, "has a query string"),
        ({"model": "m", "llm_endpoint": "nope"}, "Unknown endpoint nope"),
        ({"model": "m", "llm_endpoint": "custom"}, "Type the custom endpoint"),
        ({"model": "m", "api_key": "two words"}, "An API key is one word"),
        ({"model": ""}, "This field is required"),
    ],
)
def test_bad_model_input_gets_a_clear_error_and_changes_nothing(
    engineer_client, engineer, settings, data, error
):
    settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL = True
    search = llm_search(engineer)
    r = engineer_client.post(reverse("searches:search_llm", args=[search.pk]), data)
    assert r.status_code == 400 and error in r.content.decode()
    search.refresh_from_db()
    assert (search.model, search.llm_endpoint, search.llm_base_url) == ("", "default", "")
    assert search.llm_api_key == "" and not search.llm_changes.exists()
    assert search.status == Search.Status.RUNNING


def test_the_proposal_box_shows_only_while_the_search_is_active(engineer_client, engineer):
    search = llm_search(engineer)
    html = _search_page(engineer_client, search)
    assert '<section class="card spaced" id="proposal">' in html
    assert 'id="search-status" class="card status-card" data-active="true"' in html
    services.stop_search(search=search, user=engineer)
    services.finish_search(search=Search.objects.get(pk=search.pk), reason="stopped")
    html = _search_page(engineer_client, search)
    assert '<section class="card spaced" id="proposal" hidden>' in html
    # The live status section says so too: the stylesheet hides the box on its word.
    assert 'id="search-status" class="card status-card" data-active="false"' in html
    css = (ROOT / "static/css/app.css").read_text()
    assert '#search-status[data-active="false"] ~ #proposal { display: none; }' in css


def test_a_finished_or_tuner_search_has_no_model_to_switch(engineer_client, engineer, search):
    r = engineer_client.post(reverse("searches:search_llm", args=[search.pk]), {"model": "m"})
    assert r.status_code == 400 and "runs the built-in tuner" in r.content.decode()
    assert 'id="llm-panel"' not in _search_page(engineer_client, search)


def test_outsiders_cannot_switch_models_or_write_notes(client, outsider, engineer):
    search = llm_search(engineer)
    client.force_login(outsider)
    assert (
        client.post(reverse("searches:search_llm", args=[search.pk]), {"model": "x"}).status_code
        == 403
    )
    assert (
        client.post(reverse("searches:search_note", args=[search.pk]), {"text": "x"}).status_code
        == 403
    )
    search.refresh_from_db()
    assert search.model == "" and not SearchNote.objects.exists()


def test_a_note_for_the_agent_is_saved_and_listed(engineer_client, engineer):
    search = llm_search(engineer)
    url = reverse("searches:search_note", args=[search.pk])
    assert engineer_client.post(url, {"text": "  "}).status_code == 400
    r = engineer_client.post(url, {"text": "Try a single pass for N <= 8192."})
    assert r.status_code == 302
    assert SearchNote.objects.get().text == "Try a single pass for N <= 8192."
    assert "Try a single pass for N &lt;= 8192." in _search_page(engineer_client, search)


def test_the_trial_page_shows_the_prompt_and_cost(engineer_client, engineer):
    search = llm_search(engineer)
    trial = propose(
        search, 1, proposer="llm:model-a", model="model-a", prompt="### system\n\n<role> text"
    )
    html = engineer_client.get(reverse("searches:trial", args=[search.pk, trial.index])).content
    html = html.decode()
    assert 'id="prompt"' in html and "&lt;role&gt; text" in html


def test_the_idea_form_offers_llm_models_packs_and_a_token_budget(engineer_client, settings):
    settings.AUTOWEB_LLM_MODELS = ["gpt-4o", "qwen2.5-coder:32b"]
    html = engineer_client.get(reverse("searches:idea_new")).content.decode()
    assert 'value="llm:gpt-4o"' in html and 'value="llm:qwen2.5-coder:32b"' in html
    assert 'value="deepseek-mla-sparse"' in html and 'name="max_tokens"' in html
    data = {
        "title": "agent softmax",
        "problem": "softmax",
        "target_kinds": ["interpret"],
        "start_anyway": "on",  # no worker online in this test
        "proposer": "llm:other",
        "llm_model": "deepseek-ai/DeepSeek-V3",
        "context_packs": ["deepseek-mla-sparse"],
        "max_trials": 10,
        "max_gpu_minutes": 5,
        "max_wall_minutes": 5,
        "max_tokens": 50000,
    }
    r = engineer_client.post(reverse("searches:idea_new"), data)
    assert r.status_code == 302
    idea = Idea.objects.get()
    assert idea.proposer == "llm:deepseek-ai/DeepSeek-V3" and idea.max_tokens == 50000
    assert idea.context_packs == ["deepseek-mla-sparse"]


def test_the_idea_form_says_what_is_wrong_with_an_llm_choice(engineer_client):
    data = {
        "title": "agent softmax",
        "problem": "softmax",
        "target_kinds": ["interpret"],
        "start_anyway": "on",  # no worker online in this test
        "proposer": "llm:other",
        "llm_model": "",
        "context_packs": ["no-such-pack"],
        "max_trials": 10,
        "max_gpu_minutes": 5,
        "max_wall_minutes": 5,
    }
    r = engineer_client.post(reverse("searches:idea_new"), data)
    html = r.content.decode()
    assert r.status_code == 400 and not Idea.objects.exists()
    assert "Type the model&#x27;s name" in html and "no-such-pack" in html
    assert 'value="agent softmax"' in html  # nothing typed is lost


def test_context_packs_are_listed_and_an_edit_is_a_new_version(engineer_client, engineer):
    html = engineer_client.get(reverse("searches:packs")).content.decode()
    for name in ("h200", "h100", "b200", "a100", "l40s", "deepseek-mla-sparse"):
        assert f"{name} v1" in html
    url = reverse("searches:pack", args=["model", "deepseek-mla-sparse"])
    assert "kv_lora_rank" in engineer_client.get(url).content.decode()
    r = engineer_client.post(url, {"title": "DeepSeek MLA", "body": "# MLA\n\nrank 512\n"})
    assert r.status_code == 302
    pack = packs.get("model", "deepseek-mla-sparse")
    assert (pack.version, pack.body, pack.edited) == (2, "# MLA\n\nrank 512\n", True)
    r = engineer_client.post(url, {"title": "x", "body": "  "})
    assert r.status_code == 400 and "The pack is empty" in r.content.decode()
    assert ContextPack.objects.count() == 1
    new = reverse("searches:pack_new", args=["model"])
    r = engineer_client.post(new, {"name": "Bad Name!", "body": "x"})
    assert r.status_code == 400 and "A pack name is" in r.content.decode()
    r = engineer_client.post(new, {"name": "llama-gqa", "title": "Llama GQA", "body": "GQA 8"})
    assert r.status_code == 302 and packs.get("model", "llama-gqa").version == 1


def test_an_edited_pack_reaches_the_next_prompt(engineer, llm_server):
    from searches.agent import step

    packs.save_pack(
        kind="model", name="deepseek-mla-sparse", title="t", body="EDITED v2", author=engineer
    )
    llm_server.script.add(
        __import__("tests.web.openai_server", fromlist=["Step"]).Step(reply="no code")
    )
    search = llm_search(engineer)
    step.fill(search, "interpret", capacity=1, enqueue=lambda t: None)
    assert "EDITED v2" in llm_server.requests[0]["messages"][1]["content"]
    assert "pack deepseek-mla-sparse v2" in llm_server.requests[0]["messages"][1]["content"]
    assert GOOD and SOFTMAX_SEED


def test_a_refused_key_shows_on_the_search_page(engineer_client, engineer, llm_server):
    from searches.agent import step
    from tests.web.openai_server import Step

    llm_server.script.add(Step(status=401, message="Incorrect API key provided: sk-test-***"))
    search = llm_search(engineer)
    step.fill(search, "interpret", capacity=1, enqueue=lambda t: None)
    html = _search_page(engineer_client, search)
    status = html[html.index('id="search-status"') :]
    assert "Failed" in status and "refused the API key (401)" in status
    assert "Set a valid key on the search page" in status
    assert "sk-test-secret-key" not in html
