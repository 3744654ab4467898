"""The releases page in a browser against the whole stack: a reviewer filters, pages forward,
revokes a release on page 2 and lands back on page 2 of the same filter."""

from __future__ import annotations

import re

import pytest

from tests.web.test_browser_e2e import (  # noqa: F401 - app: the stack fixture
    CHROMIUM,
    app,
    log_in_as_demo,
    seed_app,
)

SEED = """
from django.contrib.auth import get_user_model
from searches import services
from tests.library.helpers import bulk_releases
demo = get_user_model().objects.get(username="demo")
idea = services.create_idea(
    author=demo, title="Many releases", description="", problem="softmax",
    target_kinds=["h100"], proposer="tuner", sketch_source="", prohibitions="",
    max_trials=200, max_gpu_minutes=5, max_wall_minutes=5, max_tokens=None,
)
search = services.begin_search(search=services.start_search(idea=idea, user=demo, seed=1))
bulk_releases(search, demo, 70, kind="h100")
b200 = bulk_releases(search, demo, 5, kind="b200")
from library.models import Release
timed = dict(eager_ms=0.9, compiled_ms=0.8)
Release.objects.filter(pk=b200[-1].pk).update(
    shapes=[
        dict(shape=dict(M=1, N=1024), candidate_ms=0.5, serve="kernel", **timed),
        dict(shape=dict(M=2, N=1024), candidate_ms=0.79, serve="compiled", **timed),
    ],
    dispatch_total=2,
    dispatch_on_kernel=1,
)
print(b200[-1].pk)
"""


@pytest.mark.slow
def test_a_reviewer_revokes_on_page_2_and_stays_there(app, tmp_path):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    tabled = seed_app(tmp_path, SEED).split()[-1]

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        log_in_as_demo(page, app)
        page.goto(f"{app}/releases/")
        # A release's per-shape table opens in place, fetched when first opened.
        cell = page.locator(f'tr[data-release="{tabled}"] td.dispatch')
        expect(cell.locator("summary")).to_have_text("1 of 2 shapes on the kernel")
        expect(cell.locator("tr.serve-kernel")).to_have_count(0)
        cell.locator("summary").click()
        expect(cell.locator("tbody tr")).to_have_count(2)
        expect(cell.locator("tr.serve-compiled")).to_contain_text("torch.compile")
        expect(cell.locator("tr.serve-kernel")).to_contain_text("0.5 ms")
        page.select_option("#release-filters select[name=kind]", "h100")
        page.click("#release-filters button[type=submit]")
        page.wait_for_url(re.compile(r"/releases/\?.*kind=h100"))
        expect(page.locator(".pager")).to_contain_text("page 1 of 2 · 70 in all")
        page.click(".pager a[rel=next]")
        page.wait_for_url(re.compile(r"kind=h100.*page=2"))
        rows = page.locator("tr.release-row")
        expect(rows).to_have_count(20)
        first = rows.first.get_attribute("data-release")
        rows.first.locator("input[name=reason]").fill("slower than claimed on small N")
        rows.first.locator("button[type=submit]").click()
        page.wait_for_url(re.compile(r"kind=h100.*page=2"))
        expect(page.locator(".messages")).to_contain_text(f"Release {first} revoked")
        expect(page.locator(f'tr[data-release="{first}"]')).to_contain_text("revoked")
        expect(page.locator(".pager")).to_contain_text("page 2 of 2")
        expect(page.locator("#summary-softmax-h100")).to_contain_text("69")
        browser.close()
