"""The live view end to end: Chromium on the real search page, htmx's ws extension, daphne, the
session cookie, the real channels_redis layer. Proves the frames swap into the page as meant."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
import redis
from channels.testing.live import make_application
from daphne.testing import DaphneProcess
from django.conf import settings as django_settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.db import connections
from django.test import Client

from searches import live, services
from tests.conftest import channel_layers, test_redis_url
from tests.web.domain import idea_kwargs, propose

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REDIS_URL = test_redis_url(8)
PREFIX = f"autoweb-test-live-browser-{os.getpid()}"
CHROMIUM = "/usr/bin/chromium"

PAGE = """<!doctype html>
<html><head>
<script src="/static/vendor/htmx-2.0.11.min.js"></script>
<script src="/static/vendor/htmx-ext-ws-2.0.4.js"></script>
</head><body>
<div hx-ext="ws" ws-connect="/ws/searches/SEARCH/">
  <section id="search-status">rendered by the page</section>
  <div id="live-error"></div>
  <pre id="proposal-stream"></pre>
  <table><tbody id="trial-rows" data-page="1"><tr class="empty-row"><td>none</td></tr></tbody>
  </table>
  <form id="send" ws-send><input name="since" value=""><button>send</button></form>
</div>
</body></html>
"""


def with_test_page(get_application):
    """The project's ASGI app, plus a bare page at /live-test/<id>/ with the elements the search
    page does not carry yet (the token stream, the error box, a ws-send form), served by daphne
    itself so that its socket is same-origin as in production."""
    app = get_application()

    async def application(scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/live-test/"):
            search_id = path.strip("/").rsplit("/", 1)[-1]
            body = PAGE.replace("SEARCH", str(int(search_id))).encode()
            headers = [(b"content-type", b"text/html; charset=utf-8")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return application


@pytest.fixture
def server(transactional_db, settings):
    """daphne in a child process (forked: it inherits the test database and these settings)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium")
    pytest.importorskip("playwright.sync_api")
    settings.ALLOWED_HOSTS = ["localhost"]
    settings.CHANNEL_LAYERS = channel_layers(settings.CHANNEL_LAYERS, REDIS_URL, PREFIX)
    connections.close_all()
    process = DaphneProcess(
        "localhost",
        partial(with_test_page, partial(make_application, static_wrapper=ASGIStaticFilesHandler)),
    )
    process.start()
    assert process.ready.wait(30), "daphne did not start"
    yield f"http://localhost:{process.port.value}"
    process.terminate()
    process.join(10)
    conn = redis.Redis.from_url(REDIS_URL)
    for key in conn.scan_iter(f"{PREFIX}*"):
        conn.delete(key)


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


RECORD_EVENTS = """
window.events = [];
for (const name of ["htmx:wsConnecting", "htmx:wsOpen", "htmx:oobErrorNoTarget"]) {
  document.addEventListener(name, () => window.events.push(name.slice(5)));
}
document.addEventListener("htmx:wsClose", (e) => window.events.push(e.detail.event.code));
document.addEventListener("htmx:wsAfterMessage", () => window.events.push("message"));
"""


def open_page(browser, url: str, path: str, cookie: str | None):
    context = browser.new_context()
    if cookie:
        context.add_cookies(
            [{"name": django_settings.SESSION_COOKIE_NAME, "value": cookie, "url": url}]
        )
    context.add_init_script(RECORD_EVENTS)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{url}{path}")
    return page


def row_ids(page) -> list[str]:
    return page.eval_on_selector_all("#trial-rows > tr.trial", "rows => rows.map(r => r.id)")


def messages(page) -> int:
    return page.evaluate("window.events.filter(e => e === 'message').length")


@pytest.fixture
def cookie(engineer) -> str:
    client = Client()
    client.force_login(engineer)
    return client.cookies[django_settings.SESSION_COOKIE_NAME].value


@pytest.fixture
def orm():
    """Playwright's sync API runs an event loop in the test's thread, where Django refuses the
    ORM: database work goes to this thread. (Fixtures that touch the database are listed
    before `browser`, so they run before it starts.)"""
    pool = ThreadPoolExecutor(1)

    def run(fn, *args, **kwargs):
        return pool.submit(fn, *args, **kwargs).result(timeout=30)

    yield run
    run(connections.close_all)  # or PostgreSQL cannot drop the test database at the end
    pool.shutdown()


def test_the_search_page_shows_trials_and_status_live(
    search, engineer, cookie, orm, server, browser
):
    first = orm(propose, search, 1)
    page = open_page(browser, server, f"/searches/{search.pk}", cookie)
    page.wait_for_function("window.events.filter(e => e === 'message').length >= 2")  # catch-up
    assert row_ids(page) == [f"trial-{first.pk}"]
    assert "running" in page.inner_text("#search-status").lower()

    second = orm(propose, search, 2)
    orm(live.trial_changed, second)
    page.wait_for_selector(f"#trial-{second.pk}")
    assert row_ids(page) == [f"trial-{second.pk}", f"trial-{first.pk}"]  # new on top
    assert not page.is_visible("#trial-rows .empty-row")

    queued = orm(services.mark_trial_queued, trial=first, job_id="job-1")
    orm(live.trial_changed, queued)
    page.wait_for_function(
        f"document.querySelector('#trial-{first.pk}').innerText.toLowerCase().includes('queued')"
    )
    assert row_ids(page) == [f"trial-{second.pk}", f"trial-{first.pk}"]  # in place

    # The status section on screen is the pushed one: its forms carry a CSRF token rendered for
    # this browser's cookie, so pausing through it works.
    page.click("#search-status button:has-text('Pause')")
    page.wait_for_function(
        "document.querySelector('#search-status').innerText.toLowerCase().includes('paused')"
    )
    assert orm(lambda: type(search).objects.get(pk=search.pk).status) == "paused"
    assert page.locator("section#search-status").count() == 1
    assert page.evaluate("window.events").count("oobErrorNoTarget") == 0
    assert page.evaluate("window.events")[:2] == ["wsConnecting", "wsOpen"]
    assert page.evaluate("window.events").count("wsConnecting") == 1


@pytest.fixture
def big_search(engineer):
    idea = services.create_idea(**idea_kwargs(engineer, max_trials=200))
    return services.begin_search(search=services.start_search(idea=idea, user=engineer, seed=3))


def test_an_older_page_takes_no_inserts_while_paging_keeps_the_socket(
    big_search, cookie, orm, server, browser
):
    search = big_search
    trials = [orm(propose, search, i) for i in range(52)]  # two pages of 50
    page = open_page(browser, server, f"/searches/{search.pk}", cookie)
    page.wait_for_function("window.events.filter(e => e === 'message').length >= 2")
    assert len(row_ids(page)) == 50
    page.click("#trials a[rel=next]")  # htmx swaps #trials; the socket stays open
    page.wait_for_selector("#trial-rows[data-page='2']")
    assert row_ids(page) == [f"trial-{t.pk}" for t in reversed(trials[:2])]
    seen = messages(page)

    newest = orm(propose, search, 99)
    orm(live.trial_changed, newest)
    page.wait_for_function(f"window.events.filter(e => e === 'message').length > {seen}")
    assert row_ids(page) == [f"trial-{t.pk}" for t in reversed(trials[:2])]
    page.click("#trials a[rel=prev]")
    page.wait_for_selector("#trial-rows[data-page='1']")
    assert row_ids(page)[0] == f"trial-{newest.pk}"
    assert page.evaluate("window.events").count("wsConnecting") == 1


def test_tokens_and_errors_reach_their_elements(search, cookie, orm, server, browser):
    page = open_page(browser, server, f"/live-test/{search.pk}/", cookie)
    page.wait_for_function("window.events.filter(e => e === 'message').length >= 1")
    orm(live.token, search.pk, "trial 3", "<b>BLOCK</b> = 1024\n")
    orm(live.token, search.pk, "trial 3", "\nNUM_WARPS = 8")
    page.wait_for_function(
        "document.querySelector('#proposal-stream').textContent.includes('NUM_WARPS')"
    )
    assert page.text_content("#proposal-stream") == "<b>BLOCK</b> = 1024\n\nNUM_WARPS = 8"
    assert page.locator("#proposal-stream b").count() == 0

    # htmx's ws-send: a bad timestamp shows the error, and the socket keeps streaming.
    page.fill("#send input", "last tuesday")
    page.click("#send button")
    page.wait_for_selector('#live-error[data-error="bad_since"]')
    trial = orm(propose, search, 1)
    orm(live.trial_changed, trial)
    page.wait_for_selector(f"#trial-{trial.pk}")
    assert page.evaluate("window.events").count("wsConnecting") == 1


def test_a_logged_out_browser_is_closed_once_and_does_not_retry(search, server, browser):
    page = open_page(browser, server, f"/live-test/{search.pk}/", cookie=None)
    page.wait_for_function("window.events.includes(4401)")
    page.wait_for_timeout(1500)  # htmx's first retry would come within a second
    assert page.evaluate("window.events") == ["wsConnecting", "wsOpen", 4401]
    assert page.inner_text("#search-status") == "rendered by the page"
