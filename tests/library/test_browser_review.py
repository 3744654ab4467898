"""Review in a browser against the whole stack (`manage.py up`: web, orchestrator, interpreter
worker): a reviewer opens a candidate whose rationale is hostile, approves it on a shape range,
and sees the re-validation pass and the release appear."""

from __future__ import annotations

import time

import pytest

from tests.web.test_browser_e2e import (  # noqa: F401 - app: the stack fixture
    CHROMIUM,
    app,
    log_in_as_demo,
    seed_app,
)

SEED = """
from searches import services
from searches.models import Search
from django.contrib.auth import get_user_model
from tests.library.helpers import HONEST_SOFTMAX, candidate
from tests.web.pages import HOSTILE
demo = get_user_model().objects.get(username="demo")
idea = services.create_idea(
    author=demo, title="Browser review", description="", problem="softmax",
    target_kinds=["interpret"], proposer="tuner", sketch_source="", prohibitions="",
    max_trials=5, max_gpu_minutes=5, max_wall_minutes=5, max_tokens=None,
)
search = services.start_search(idea=idea, user=demo, seed=1)
search = services.begin_search(search=search)
trial = candidate(search, HONEST_SOFTMAX, rationale=HOSTILE, prompt=HOSTILE)
services.finish_search(search=Search.objects.get(pk=search.pk), reason="seeded")
print(trial.pk)
"""


@pytest.mark.slow
def test_a_reviewer_approves_in_the_browser_and_the_kernel_is_released(app, tmp_path):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    trial_id = int(seed_app(tmp_path, SEED).strip().splitlines()[-1])

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        log_in_as_demo(page, app)
        page.goto(f"{app}/reviews/")
        page.click(f"a[href='/reviews/trials/{trial_id}']")
        page.wait_for_url(f"**/reviews/trials/{trial_id}")
        expect(page.locator("#rationale")).to_contain_text("<script>alert(1)</script>")
        page.fill("input[name=range_M_hi]", "64")
        page.click("#approve-form button[type=submit]")
        expect(page.locator("#decided")).to_contain_text("Approve", timeout=30_000)
        deadline = time.monotonic() + 240
        while "released" not in page.locator("#decided").inner_text():
            assert time.monotonic() < deadline, page.locator("#decision").inner_text()
            time.sleep(2)
            page.reload()
        expect(page.locator("#revalidation")).to_contain_text("passed")
        page.goto(f"{app}/releases/")
        expect(page.locator("#releases-softmax-interpret")).to_contain_text("M 1–64")
        assert dialogs == [], "hostile text ran as script"
        browser.close()
