"""Submitting an idea, the idea page, and starting a search from it."""

from __future__ import annotations

import html as htmllib
import re

import pytest
from django.urls import reverse

from kernels.protocol import SEARCH_QUEUE
from kernels.queues import register, rq_queue
from searches.models import Idea, Search
from tests.web.domain import SOFTMAX_SEED
from tests.web.pages import HOSTILE, HOSTILE_RAW, ROOT, assert_inert

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

NEW = reverse("searches:idea_new")


def form_data(**overrides):
    data = {
        "title": "Bigger blocks for softmax",
        "description": "Try **larger** `BLOCK_N` on wide rows.",
        "problem": "softmax",
        "target_kinds": ["h200", "interpret"],
        "start_anyway": "on",  # no worker is online in these tests
        "proposer": "tuner",
        "max_trials": "40",
        "max_gpu_minutes": "20",
        "max_wall_minutes": "90",
        "sketch_source": SOFTMAX_SEED,
        "prohibitions": "no fp16 accumulation\nno torch.softmax",
    }
    data.update(overrides)
    return data


def field_block(html: str, name: str) -> str:
    """The HTML of one form field's block (label, input, help, errors)."""
    match = re.search(
        rf'<div class="field[^"]*" id="field-{name}">(.*?)(?:id="field-|</form>)', html, re.S
    )
    assert match, f"no field {name}"
    return match.group(1)


def test_the_form_offers_every_problem_and_the_known_and_online_gpu_kinds(
    engineer_client, redis_url
):
    register(redis_url, "box:gpu0", {"kind": "mi300x", "queue": "gpu.mi300x", "versions": {}})
    html = engineer_client.get(NEW).content.decode()
    for problem in ("softmax", "rmsnorm", "attention"):
        assert f'<option value="{problem}"' in html
    for kind in ("interpret", "h200", "h100", "b200", "a100", "l40s", "mi300x"):
        assert f'value="{kind}"' in html
    assert "mi300x · online" in html
    assert '<option value="tuner"' in html


def test_a_valid_idea_is_saved_and_the_browser_goes_to_its_page(engineer_client, engineer):
    response = engineer_client.post(NEW, form_data())
    idea = Idea.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("searches:idea", args=[idea.pk])
    assert idea.author == engineer
    assert idea.title == "Bigger blocks for softmax"
    assert idea.problem == "softmax"
    assert idea.target_kinds == ["h200", "interpret"]
    assert (idea.max_trials, idea.max_gpu_minutes, idea.max_wall_minutes) == (40, 20, 90)
    assert idea.max_tokens is None
    assert idea.sketch_source == SOFTMAX_SEED
    assert idea.prohibition_list == ["no fp16 accumulation", "no torch.softmax"]


def test_an_htmx_submit_is_redirected_by_header(engineer_client):
    response = engineer_client.post(
        NEW, form_data(sketch_source=""), headers={"HX-Request": "true"}
    )
    idea = Idea.objects.get()
    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("searches:idea", args=[idea.pk])
    assert idea.sketch_source == ""


BAD_SKETCH_IMPORT = SOFTMAX_SEED.replace("import torch", "import os\nimport torch", 1)
BAD_SKETCH_SYNTAX = SOFTMAX_SEED + "\ndef broken(:\n    pass\n"


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"problem": "fft_9000"}, "problem", "Unknown problem fft_9000"),
        ({"max_trials": "0"}, "max_trials", "greater than or equal to 1"),
        ({"max_gpu_minutes": "lots"}, "max_gpu_minutes", "Enter a whole number"),
        ({"max_wall_minutes": "99999999"}, "max_wall_minutes", "less than or equal to"),
        ({"sketch_source": BAD_SKETCH_IMPORT}, "sketch_source", "os"),
        ({"sketch_source": BAD_SKETCH_SYNTAX}, "sketch_source", "static checks (compile_error)"),
        ({"target_kinds": []}, "target_kinds", "Choose at least one target GPU kind"),
        ({"title": "  "}, "title", "This field is required"),
    ],
    ids=[
        "unknown-problem",
        "zero-trials",
        "text-budget",
        "huge-budget",
        "import-os",
        "syntax",
        "no-kinds",
        "no-title",
    ],
)
def test_each_mistake_is_shown_on_its_field_and_nothing_typed_is_lost(
    engineer_client, overrides, field, message
):
    data = form_data(**overrides)
    response = engineer_client.post(NEW, data)
    assert response.status_code == 400
    html = response.content.decode()
    block = field_block(html, field)
    assert 'class="field-error"' in block
    assert message in htmllib.unescape(block)
    assert "Nothing you typed was lost" in html
    # Every value comes back as typed, the sketch inside its textarea.
    sketch = re.search(r'<textarea name="sketch_source"[^>]*>\n?(.*?)</textarea>', html, re.S)
    assert htmllib.unescape(sketch.group(1)) == data["sketch_source"]
    if data["title"].strip():
        assert f'value="{data["title"]}"' in html
    assert "no fp16 accumulation\nno torch.softmax" in html
    for kind in data["target_kinds"]:
        assert re.search(rf'value="{kind}"[^>]*checked', html)
    assert Idea.objects.count() == 0


def test_a_long_description_or_title_gets_a_clear_error_not_a_silent_cut(engineer_client):
    long_text = "Try wider blocks." + " More." * 3597  # 21,599 characters
    html = engineer_client.get(NEW).content.decode()
    # No maxlength: a browser would cut a pasted text there without a word.
    for name in ("title", "description"):
        assert "maxlength" not in field_block(html, name)
    response = engineer_client.post(NEW, form_data(description=long_text, title="T" * 250))
    assert response.status_code == 400
    html = response.content.decode()
    description = htmllib.unescape(field_block(html, "description"))
    assert "The description is 21,599 characters; keep it within 20,000." in description
    assert long_text in description  # nothing typed is lost
    title = htmllib.unescape(field_block(html, "title"))
    assert "The title is 250 characters; keep it within 200." in title
    assert Idea.objects.count() == 0


def test_the_service_refuses_a_description_over_the_limit_too(engineer):
    from core.errors import DomainError
    from searches import services
    from tests.web.domain import idea_kwargs

    with pytest.raises(DomainError) as error:
        services.create_idea(**idea_kwargs(engineer, description="x" * 20_001))
    assert "keep it within 20,000" in str(error.value.message_dict["description"])
    assert services.create_idea(**idea_kwargs(engineer, description="x" * 20_000)).pk


def test_the_form_says_the_tuner_ignores_the_text_and_hides_other_model_for_it(
    engineer_client,
):
    html = engineer_client.get(NEW).content.decode()
    assert '<option value="tuner" selected>' in html
    note = re.search(r'<p class="help note" id="tuner-ignores-text">(.*?)</p>', html, re.S)
    assert note and "tuner does not read this text" in note.group(1)
    css = (ROOT / "static/css/app.css").read_text()
    # The stylesheet shows the note only with the tuner, "Other model" only with another model
    # (the browser test checks what a user sees).
    assert (
        '#idea-form:not(:has(#id_proposer option[value="tuner"]:checked)) '
        "#tuner-ignores-text { display: none; }"
    ) in css
    assert (
        '#idea-form:not(:has(#id_proposer option[value="llm:other"]:checked)) '
        "#field-llm_model { display: none; }"
    ) in css


def test_the_only_online_gpu_kind_is_preselected(engineer_client, redis_url):
    html = engineer_client.get(NEW).content.decode()
    assert not re.search(r'name="target_kinds" value="[^"]+"[^>]*checked', html)  # none online
    register(redis_url, "box:cpu0", {"kind": "interpret", "queue": "gpu.interpret", "versions": {}})
    html = engineer_client.get(NEW).content.decode()
    checked = re.findall(r'name="target_kinds" value="([^"]+)"[^>]*checked', html)
    assert checked == ["interpret"]
    register(redis_url, "box:gpu0", {"kind": "h200", "queue": "gpu.h200", "versions": {}})
    html = engineer_client.get(NEW).content.decode()
    assert not re.search(r'name="target_kinds" value="[^"]+"[^>]*checked', html)  # a choice


def test_a_sketch_that_imports_os_names_the_import(engineer_client):
    response = engineer_client.post(NEW, form_data(sketch_source=BAD_SKETCH_IMPORT))
    block = htmllib.unescape(field_block(response.content.decode(), "sketch_source"))
    assert "prohibited" in block and "os" in block
    assert Idea.objects.count() == 0


def test_an_htmx_submit_with_mistakes_gets_the_form_back_to_swap(engineer_client):
    response = engineer_client.post(
        NEW, form_data(sketch_source=BAD_SKETCH_SYNTAX), headers={"HX-Request": "true"}
    )
    assert response.status_code == 200  # htmx swaps only 2xx
    html = response.content.decode()
    assert html.lstrip().startswith('<form id="idea-form"')
    assert "<html" not in html
    assert 'class="field-error"' in field_block(html, "sketch_source")
    assert Idea.objects.count() == 0


def test_a_user_without_a_role_cannot_submit(outsider_client):
    response = outsider_client.post(NEW, form_data())
    assert response.status_code == 403
    assert Idea.objects.count() == 0


def test_the_idea_page_renders_markdown_safely_and_highlights_the_sketch(engineer_client, engineer):
    engineer_client.post(
        NEW,
        form_data(
            title=f"T {HOSTILE}",
            description=f"**bold** [link](javascript:alert(1)) {HOSTILE}",
            prohibitions=HOSTILE,
        ),
    )
    idea = Idea.objects.get()
    html = engineer_client.get(reverse("searches:idea", args=[idea.pk])).content.decode()
    assert "<strong>bold</strong>" in html
    assert 'href="javascript:' not in html
    assert_inert(html)
    for raw in HOSTILE_RAW:
        assert raw not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<div class="highlight">' in html
    assert '<span class="k">def</span><span class="w"> </span><span class="nf">kernel' in html
    assert re.search(r'name="request_key" value="[0-9a-f]{32}"', html)


def test_starting_twice_with_one_request_key_makes_one_search(
    engineer_client, idea, redis_url, django_capture_on_commit_callbacks
):
    url = reverse("searches:idea_start", args=[idea.pk])
    with django_capture_on_commit_callbacks(execute=True):
        first = engineer_client.post(url, {"request_key": "click-1"})
        second = engineer_client.post(url, {"request_key": "click-1"})
    search = Search.objects.get()
    assert search.idea == idea
    assert search.status == Search.Status.QUEUED
    assert first["Location"] == second["Location"] == reverse("searches:search", args=[search.pk])
    jobs = rq_queue(SEARCH_QUEUE, redis_url).jobs
    assert jobs and {tuple(job.args) for job in jobs} == {(search.pk,)}


def test_a_new_request_key_starts_another_search(engineer_client, idea):
    url = reverse("searches:idea_start", args=[idea.pk])
    engineer_client.post(url, {"request_key": "a"})
    engineer_client.post(url, {"request_key": "b"})
    assert Search.objects.filter(idea=idea).count() == 2
    html = engineer_client.get(reverse("searches:idea", args=[idea.pk])).content.decode()
    for search in Search.objects.all():
        assert reverse("searches:search", args=[search.pk]) in html


@pytest.mark.django_db(transaction=True)  # on_commit must run when the view's transaction ends
def test_a_start_the_queue_cannot_take_still_saves_the_search_and_says_so(
    engineer_client, idea, dead_redis
):
    response = engineer_client.post(
        reverse("searches:idea_start", args=[idea.pk]), {"request_key": "k"}, follow=True
    )
    search = Search.objects.get()
    assert response.redirect_chain[-1][0] == reverse("searches:search", args=[search.pk])
    assert "unreachable" in response.content.decode()


def test_the_ideas_list_links_every_idea(engineer_client, idea):
    html = engineer_client.get(reverse("searches:ideas")).content.decode()
    assert reverse("searches:idea", args=[idea.pk]) in html
    assert idea.title in html
