"""The pages on a phone (390 x 844, as an iPhone 12-15) and on a laptop (1440 px): Chromium on
the real app. Nothing scrolls sideways, the nav wraps and works, charts fit, the idea form
follows its proposer, and the per-shape table fits a laptop without a scroll bar."""

from __future__ import annotations

import pytest
from django.urls import reverse

from searches import live, services
from searches.models import Search
from tests.web import test_live_browser as live_browser
from tests.web.agent_helpers import llm_search
from tests.web.domain import propose
from tests.web.pages import h200_report, judged, knob_variant
from tests.web.test_live_browser import open_page

# The live view's fixtures: daphne in a child process, Chromium, the ORM's own thread.
browser, cookie, orm, server = (
    live_browser.browser,
    live_browser.cookie,
    live_browser.orm,
    live_browser.server,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1440, "height": 900}
NAV = ["Dashboard", "Ideas", "New idea", "Problems", "Workers", "GPUs", "Reviews", "Releases"]

# What scrolls sideways: the page as a whole, and (for the report) the table's own box.
OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


def at(browser, server, cookie, path, viewport):
    page = open_page(browser, server, path, cookie)
    page.set_viewport_size(viewport)
    page.wait_for_load_state("networkidle")
    return page


def assert_fits(page, what):
    overflow = page.evaluate(OVERFLOW)
    if overflow > 0:  # name the widest elements, so a failure says what to fix
        wide = page.evaluate(
            """() => Array.from(document.querySelectorAll('body *'))
                 .filter(e => e.getBoundingClientRect().right
                              > document.documentElement.clientWidth + 1)
                 .slice(0, 8).map(e => e.tagName + '#' + e.id + '.' + e.className)"""
        )
        raise AssertionError(f"{what} scrolls sideways by {overflow}px: {wide}")


def assert_nav_usable(page):
    width = page.evaluate("document.documentElement.clientWidth")
    for name in NAV:
        link = page.locator(".nav a", has_text=name).first
        assert link.is_visible(), name
        box = link.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (name, box)
        assert box["height"] >= 24, (name, box)  # a finger can hit it


@pytest.fixture
def pages(search, engineer):
    """A search with a timed trial (a full H200 report) and a child trial, and an LLM search."""
    best = judged(search, knob_variant(2048), h200_report(), rationale="wider rows " * 20)
    judged(search, knob_variant(4096), h200_report(geomean_ms=0.05), parent=best)
    return {"search": search, "trial": best, "llm": llm_search(engineer)}


def test_every_page_fits_a_phone_and_the_nav_wraps_and_works(pages, cookie, orm, server, browser):
    search, trial = pages["search"], pages["trial"]
    paths = {
        "dashboard": reverse("searches:dashboard"),
        "search": reverse("searches:search", args=[search.pk]),
        "trial": reverse("searches:trial", args=[search.pk, trial.index]),
        "compare": reverse("searches:compare", args=[search.pk]) + "?a=1&b=2",
        "problems": reverse("searches:problems"),
        "new idea": reverse("searches:idea_new"),
        "releases": reverse("library:releases"),
    }
    for what, path in paths.items():
        page = at(browser, server, cookie, path, PHONE)
        if what in ("dashboard", "search"):  # the charts are loaded after the page
            page.wait_for_selector("figure.chart[data-state]", timeout=20_000)
        assert_fits(page, what)
        assert_nav_usable(page)
        page.context.close()

    page = at(browser, server, cookie, paths["search"], PHONE)
    page.wait_for_selector("figure.chart[data-state='drawn']", timeout=20_000)
    for box in page.eval_on_selector_all(
        "figure.chart", "els => els.map(e => e.getBoundingClientRect().right)"
    ):
        assert box <= 390, box  # every chart fits the screen
    page.locator(".nav a", has_text="Problems").first.click()
    page.wait_for_url(f"**{paths['problems']}")
    assert_fits(page, "problems, reached through the nav")
    page.context.close()


def test_the_per_shape_table_fits_a_laptop(pages, cookie, orm, server, browser):
    trial = pages["trial"]
    page = at(browser, server, cookie, reverse("searches:trial", args=[trial.search_id, 1]), LAPTOP)
    assert_fits(page, "trial page")
    wrap = page.locator("#shapes .table-wrap")
    assert wrap.evaluate("e => e.scrollWidth - e.clientWidth") <= 0
    for header in ("roofline", "bound", "timing"):
        cell = page.locator("#shapes th", has_text=header).first
        box = cell.bounding_box()
        assert box["x"] + box["width"] <= wrap.bounding_box()["x"] + wrap.bounding_box()["width"]
    page.context.close()


def test_the_idea_form_follows_the_proposer(cookie, orm, server, browser):
    page = at(browser, server, cookie, reverse("searches:idea_new"), PHONE)
    assert page.is_visible("#tuner-ignores-text")
    assert not page.is_visible("#field-llm_model")
    page.select_option("#id_proposer", "llm:other")
    assert not page.is_visible("#tuner-ignores-text")
    assert page.is_visible("#field-llm_model")
    assert_fits(page, "idea form with an LLM")
    page.context.close()


def test_the_proposal_box_goes_away_when_the_search_ends(
    pages, engineer, cookie, orm, server, browser
):
    search = pages["llm"]
    page = at(browser, server, cookie, reverse("searches:search", args=[search.pk]), PHONE)
    page.wait_for_function("window.events.filter(e => e === 'message').length >= 1")
    assert page.is_visible("#proposal")
    assert_fits(page, "LLM search")
    # The model switch: the "clear key" checkbox before its label on one line, the button below
    # the fields at its own width.
    box = page.locator("#id_clear_key").bounding_box()
    label = page.locator("label[for='id_clear_key']").bounding_box()
    assert (
        box["x"] < label["x"]
        and abs(box["y"] + box["height"] / 2 - (label["y"] + label["height"] / 2)) < 6
    )
    button = page.locator("#llm-form button[type=submit]").bounding_box()
    assert button["y"] >= label["y"] + label["height"] and button["width"] < 250
    orm(propose, search, 1)

    def end():
        stopped = services.stop_search(search=search, user=engineer)
        finished = services.finish_search(search=stopped, reason="stopped by a test")
        live.search_changed(Search.objects.get(pk=finished.pk))

    orm(end)
    page.wait_for_selector("#search-status[data-active='false']")
    assert not page.is_visible("#proposal")
    assert page.inner_text("#trials-total") == "1 in all"  # pushed with the status
    page.context.close()
