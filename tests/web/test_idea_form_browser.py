"""The idea form in Chromium: choosing a GPU kind with no worker online asks before submitting;
no keeps the form as typed and saves nothing, yes submits (the script ticks the form's "submit
anyway" box, which the server asks for otherwise). Daphne serves the real page."""

from __future__ import annotations

import re

import pytest

from searches.models import Idea
from tests.web.test_live_browser import browser, cookie, orm, server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_submitting_for_an_offline_kind_asks_first(redis_url, cookie, orm, server, browser):  # noqa: F811
    context = browser.new_context()
    context.add_cookies([{"name": "sessionid", "value": cookie, "url": server}])
    page = context.new_page()
    asked: list[str] = []
    answer = ["dismiss"]

    def on_dialog(dialog) -> None:
        asked.append(dialog.message)
        getattr(dialog, answer[0])()

    page.on("dialog", on_dialog)
    page.goto(f"{server}/ideas/new")
    page.fill("input[name=title]", "Softmax on the H200")
    page.select_option("select[name=problem]", "softmax")
    page.check("input[name=target_kinds][value=h200]")
    page.fill("input[name=max_trials]", "3")

    page.click("text=Submit idea")
    page.wait_for_timeout(500)
    assert len(asked) == 1 and "No h200 worker is online now" in asked[0]
    assert orm(Idea.objects.count) == 0
    assert page.input_value("input[name=title]") == "Softmax on the H200"
    assert not page.is_checked("input[name=start_anyway]")

    answer[0] = "accept"
    page.click("text=Submit idea")
    page.wait_for_url(re.compile(r".*/ideas/\d+$"))
    assert len(asked) == 2
    assert orm(lambda: list(Idea.objects.values_list("title", "target_kinds"))) == [
        ("Softmax on the H200", ["h200"])
    ]
