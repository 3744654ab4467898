"""The whole human-in-the-loop path in a browser on a machine without a GPU, with the demo's
imported H200 reports (`manage.py up`'s demo set): log in, submit an idea, watch its trials live,
open a diff, approve an imported candidate with a shape range (it waits visibly for an h200
worker to re-validate it), veto another with a reason that reaches the next prompt, and download
the library export and import it in a fresh environment."""

from __future__ import annotations

import subprocess

import pytest

from tests.library.helpers import venv_with
from tests.web.test_browser_e2e import (  # noqa: F401 - app: the stack fixture
    CHROMIUM,
    app,
    log_in_as_demo,
    seed_app,
)

DEMO_SET = """
from searches.management.commands.up import Command
print(Command()._demo_reports())
from library import selectors
for t in selectors.review_queue().trials:
    print("queued", t.pk, t.search.idea.problem)
"""

NOTES = """
from library import selectors
from searches.models import Trial
print(selectors.review_notes_text(Trial.objects.get(pk={pk}).search))
"""


@pytest.mark.slow
def test_the_whole_path_with_the_demo_reports_in_a_browser(app, tmp_path):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    out = seed_app(tmp_path, DEMO_SET)
    queued = [line.split() for line in out.splitlines() if line.startswith("queued ")]
    assert len(queued) >= 2, out
    (_, approve_pk, _), (_, veto_pk, _) = queued[:2]

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(accept_downloads=True)
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
        log_in_as_demo(page, app)

        # An idea, its search and its trials, live.
        page.goto(f"{app}/ideas/new")
        page.fill("input[name=title]", "Softmax knobs, the whole walk")
        page.select_option("select[name=problem]", "softmax")
        page.check("input[name=target_kinds][value=interpret]")
        page.fill("input[name=max_trials]", "2")
        page.click("text=Submit idea")
        page.wait_for_url("**/ideas/*")
        page.click("text=Start search")
        page.wait_for_url("**/searches/*")
        rows = page.locator("#trial-rows tr[id^=trial-]")
        expect(rows).to_have_count(2, timeout=180_000)
        expect(page.locator("#search-status")).to_contain_text("inished", timeout=180_000)

        # A diff: the second trial against its parent, the first.
        search_url = page.url
        page.goto(f"{search_url}/trials/2")
        expect(page.locator("#diff")).to_contain_text("against trial 1")

        # The imported H200 candidates wait for review, marked as imported.
        page.goto(f"{app}/reviews/")
        expect(page.locator("body")).to_contain_text("imported from")
        page.goto(f"{app}/reviews/trials/{approve_pk}")
        expect(page.locator("body")).to_contain_text("imported from")
        hi = page.locator("#approve-form input[name$=_hi]").first
        hi.fill(str(max(1, int(hi.input_value()) // 2)))  # approve on part of the range
        page.click("#approve-form button[type=submit]")
        expect(page.locator("#decided")).to_contain_text("Approve", timeout=30_000)
        expect(page.locator("#decided")).to_contain_text("awaiting re-validation on h200")

        page.goto(f"{app}/reviews/trials/{veto_pk}")
        reason = "Too slow on the small decode rows: keep one pass."
        page.fill("#veto-form textarea[name=text]", reason)
        page.click("#veto-form button[type=submit]")
        expect(page.locator("#decided")).to_contain_text("Veto", timeout=30_000)

        # The release waits, visibly, for an h200 worker.
        page.goto(f"{app}/releases/")
        expect(page.locator("#awaiting-revalidation")).to_contain_text("h200")

        # The export: downloaded from the page, imported where autoweb is not installed.
        with page.expect_download() as info:
            page.click("text=Download all active releases (wheel)")
        wheel = tmp_path / info.value.suggested_filename
        info.value.save_as(wheel)
        assert dialogs == [], dialogs
        browser.close()

    # The veto reason reaches the next prompt of that search.
    assert reason in seed_app(tmp_path, NOTES.format(pk=veto_pk))

    py = venv_with(wheel, tmp_path)
    script = (
        "import torch, autoweb_kernels\n"
        "k = autoweb_kernels.load('softmax')\n"
        "x = torch.randn(4, 100)\n"
        "torch.testing.assert_close(k(x), torch.softmax(x, -1))\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [str(py), "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
