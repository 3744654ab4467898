"""The whole product in a browser: `manage.py up` (web, orchestrator, interpret worker,
embedded Redis), then Chromium logs in, submits an idea, starts a search and watches its
trials appear and finish live, without reloading the page."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_app(tmp_path: Path, script: str) -> str:
    """Run `script` in `manage.py shell` against the `app` fixture's database; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",)}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def log_in_as_demo(page, app: str) -> None:
    page.goto(f"{app}/accounts/login/")
    page.fill("input[name=username]", "demo")
    page.fill("input[name=password]", "browser-pw")
    page.click("button[type=submit], input[type=submit]")


@pytest.fixture
def app(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'app.sqlite3'}",
        PYTHONUNBUFFERED="1",
        AUTOWEB_DEMO_PASSWORD="browser-pw",
    )
    log = open(tmp_path / "up.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "up",
            "--port",
            str(port),
            "--no-demo",
            "--device",
            "interpret",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{base}/accounts/login/", timeout=2)
            break
        except OSError:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the app did not come up"
            time.sleep(0.5)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _wait_for_a_worker(page, app: str, kind: str, timeout_s: float = 120) -> None:
    """Open the idea form once it lists a `kind` worker online. The app's page is up before its
    worker has started (torch takes seconds to import on a loaded machine), and for a kind with
    no worker the form asks first in a dialog, which the browser here dismisses."""
    deadline = time.monotonic() + timeout_s
    while True:
        page.goto(f"{app}/ideas/new")
        online = page.get_attribute(f"input[name=target_kinds][value={kind}]", "data-online")
        if kind in (online or "").split():
            return
        assert time.monotonic() < deadline, f"no {kind} worker came online"
        time.sleep(1)


@pytest.mark.slow
def test_an_engineer_submits_an_idea_and_watches_trials_arrive_live(app):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        log_in_as_demo(page, app)
        _wait_for_a_worker(page, app, "interpret")
        page.fill("input[name=title]", "Softmax knobs from the browser")
        page.fill("textarea[name=description]", "Try the seed's *knobs*.")
        page.select_option("select[name=problem]", "softmax")
        page.check("input[name=target_kinds][value=interpret]")
        page.fill("input[name=max_trials]", "3")
        page.click("text=Submit idea")
        page.wait_for_url("**/ideas/*")
        page.click("text=Start search")
        page.wait_for_url("**/searches/*")
        url = page.url

        rows = page.locator("#trial-rows tr[id^=trial-]")
        expect(rows).to_have_count(3, timeout=180_000)
        status = page.locator("#search-status")
        expect(status).to_contain_text("inished", timeout=180_000)
        assert page.url == url, "the page was never reloaded"
        texts = " ".join(rows.all_inner_texts()).lower()
        assert "kept" in texts
        browser.close()
