"""`manage.py up` (the README's first command) starts everything and stops everything."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


@pytest.mark.slow
def test_up_serves_the_app_runs_a_demo_search_and_stops_every_process(tmp_path):
    port = _free_port()
    db = tmp_path / "up.sqlite3"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        DATABASE_URL=f"sqlite:///{db}", PYTHONUNBUFFERED="1", AUTOWEB_DEMO_PASSWORD="demo-test-pw"
    )
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--run-for", "60"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        status = None
        trials = 0
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= _descendants(proc.pid)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError:
                pass
            if db.exists():
                with sqlite3.connect(db) as c:
                    try:
                        # The demo search's own trials, not the imported reports'.
                        trials = c.execute(
                            "select count(*) from searches_trial where status in "
                            "('kept','reverted','failed') and proposer != 'imported'"
                        ).fetchone()[0]
                    except sqlite3.OperationalError:
                        trials = 0
            if status is not None and trials >= 2:
                break
            time.sleep(1)
        assert status in (200, 302), f"web answered {status}"
        assert trials >= 2, "the demo search recorded finished trials"
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "login: demo / demo-test-pw" in out
    assert "redis: redis://127.0.0.1:" in out  # embedded, since REDIS_URL was unset
    assert "review queue: 3 imported H200 reports to review (layernorm, rmsnorm, softmax)" in out
    time.sleep(1)
    alive = [
        p
        for p in seen
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive, f"processes left running: {alive}"


@pytest.mark.slow
def test_up_starts_as_many_workers_as_asked_and_restarts_one_that_dies(tmp_path):
    """`--workers 2` (on a GPU host: one per GPU by default) gives two named workers, both
    heart-beating in Redis, and two orchestrators with `--orchestrators 2`; a worker killed
    with SIGKILL is started again under the same name, and the app stays up."""
    import re

    import redis

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'up.sqlite3'}", PYTHONUNBUFFERED="1")
    args = ["--workers", "2", "--orchestrators", "2", "--no-demo", "--device", "interpret"]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--run-for", "40", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        registered: set[bytes] = set()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            lines.append(line)
            m = re.search(r"redis: (redis://\S+)", line)
            if m:
                conn = redis.Redis.from_url(m.group(1))
                while time.monotonic() < deadline and len(registered) < 2:
                    registered = set(conn.smembers("autoweb:workers"))
                    time.sleep(0.5)
                break
        workers = [p for p in _descendants(proc.pid) if "kernels.worker" in _cmd(p)]
        orchestrators = [p for p in _descendants(proc.pid) if _cmd(p).endswith("orchestrator")]
        victim = workers[0]
        victim_name = _cmd(victim).split("--name ")[1].split()[0]
        os.kill(victim, 9)
        replaced = []
        while time.monotonic() < deadline and not replaced:
            replaced = [
                p
                for p in _descendants(proc.pid)
                if f"--name {victim_name}" in _cmd(p) and p != victim
            ]
            time.sleep(0.3)
        still_up = proc.poll() is None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    host = socket.gethostname()
    assert {n.decode() for n in registered} == {f"{host}:interpret.0", f"{host}:interpret.1"}, (
        "".join(lines) + out
    )[-3000:]
    assert len(workers) == 2 and len(orchestrators) == 2
    assert replaced, "the killed worker was not started again"
    assert still_up, out[-3000:]
    assert f"worker {victim_name} exited with code -9; restarting it" in out


def _cmd(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _is_sandbox(pid: int) -> bool:
    """A worker's sandboxed child: its boot code imports the runner (kernels.harness.sandbox)."""
    return "kernels.harness.runner" in _cmd(pid)


@pytest.mark.parametrize("flag", ["--workers=0", "--orchestrators=0"])
def test_up_refuses_a_count_below_one(flag):
    r = subprocess.run(
        [sys.executable, "manage.py", "up", flag, "--no-demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "must be at least 1" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("gap_s", [0.3, 0.0])  # mid-shutdown; on the heels of the first
def test_two_sigterms_to_the_process_group_still_stop_everything(tmp_path, gap_s):
    """A second SIGTERM while `up` is shutting down must not abort the shutdown: nothing it
    started (Redis, web, orchestrator, worker, the worker's sandboxes) and no temporary
    directory of its own is left."""
    port = _free_port()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'up.sqlite3'}", PYTHONUNBUFFERED="1", TMPDIR=str(tmp)
    )
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--no-demo", "--workers", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if "autoweb is up" in proc.stdout.readline():
                break
        # The worker keeps warm sandboxes: wait until they are there too.
        while time.monotonic() < deadline:
            seen |= _descendants(proc.pid)
            if any(_is_sandbox(p) for p in seen):
                break
            time.sleep(0.5)
        assert any("kernels.worker" in _cmd(p) for p in seen), [_cmd(p) for p in seen]
        assert any(_is_sandbox(p) for p in seen), [_cmd(p) for p in seen]
        assert list(tmp.glob("autoweb-up-*")), "up made no temporary directory"
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(gap_s)  # the second signal lands in the middle of the shutdown, or its start
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(1)
    alive = [
        (p, _cmd(p))
        for p in seen
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive, f"processes left running: {alive}"
    assert not list(tmp.glob("autoweb-up-*")), "the temporary directory was left behind"
    # Nor any other: the sandboxes' working directories went with them.
    assert not list(tmp.iterdir()), sorted(p.name for p in tmp.iterdir())


@pytest.mark.django_db(transaction=True)
def test_a_restart_keeps_the_demo_password_and_starts_no_second_demo_search(
    redis_url, settings, tmp_path, monkeypatch
):
    from django.contrib.auth import get_user_model

    from searches.management.commands.up import DEMO_TITLE, DEMO_USER, Command
    from searches.models import Search

    monkeypatch.delenv("AUTOWEB_DEMO_PASSWORD", raising=False)
    settings.VAR_DIR = tmp_path
    first, again = Command(), Command()
    password = first._demo_user()
    stored = get_user_model().objects.get(username=DEMO_USER).password
    first._demo_search("interpret")
    assert again._demo_user() == password
    # Not even re-hashed: a browser's session (which holds a hash of it) stays valid.
    assert get_user_model().objects.get(username=DEMO_USER).password == stored
    Search.objects.filter(idea__title=DEMO_TITLE).update(status=Search.Status.FINISHED)
    again._demo_search("interpret")  # even once the first one finished
    assert Search.objects.filter(idea__title=DEMO_TITLE).count() == 1
    assert (tmp_path / "demo-password").stat().st_mode & 0o077 == 0


@pytest.mark.django_db(transaction=True)
def test_the_demo_user_can_give_roles_in_the_admin(redis_url, settings, tmp_path, monkeypatch):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from searches.management.commands.up import DEMO_USER, Command

    monkeypatch.setenv("AUTOWEB_DEMO_PASSWORD", "demo-pw")
    settings.VAR_DIR = tmp_path
    Command()._demo_user()
    User = get_user_model()
    alice = User.objects.create_user("alice", password="pw")
    engineers = Group.objects.get(name="engineers")
    client = Client()
    assert client.login(username=DEMO_USER, password="demo-pw")
    page = client.get(f"/admin/auth/user/{alice.pk}/change/")
    assert page.status_code == 200 and 'name="groups"' in page.content.decode()
    # Not a superuser: it cannot make one.
    assert not User.objects.get(username=DEMO_USER).is_superuser
    assert client.get("/admin/auth/group/add/").status_code == 403
    assert User.objects.get(username=DEMO_USER).has_perm("auth.change_user")
    assert f'value="{engineers.pk}"' in page.content.decode()  # the roles to pick from


@pytest.mark.django_db
def test_grant_role_gives_and_takes_a_role_and_refuses_bad_input():
    from django.contrib.auth import get_user_model
    from django.core.management import CommandError, call_command

    bob = get_user_model().objects.create_user("bob", password="pw")
    call_command("grant_role", "bob", "reviewers")
    assert list(bob.groups.values_list("name", flat=True)) == ["reviewers"]
    call_command("grant_role", "bob", "reviewers", "--revoke")
    assert not bob.groups.exists()
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("grant_role", "nobody", "reviewers")
    with pytest.raises(CommandError, match="unknown role 'admins'"):
        call_command("grant_role", "bob", "admins")
    assert not bob.groups.exists()


@pytest.mark.django_db(transaction=True)
def test_the_demo_imports_real_h200_reports_to_review_once(redis_url, settings, tmp_path):
    from library import selectors
    from searches.management.commands.up import DEMO_USER, Command
    from searches.models import ReportImport, Search

    settings.VAR_DIR = tmp_path
    first, again = Command(), Command()
    first._demo_user()
    said = first._demo_reports()
    assert said == "3 imported H200 reports to review (layernorm, rmsnorm, softmax)"
    queue = selectors.review_queue().trials
    assert sorted(t.search.idea.problem for t in queue) == ["layernorm", "rmsnorm", "softmax"]
    assert all(t.imported.kind == "h200" and t.imported.host == "vm" for t in queue)
    assert {t.imported.imported_by.username for t in queue} == {DEMO_USER}
    # A restart imports nothing again.
    again._demo_user()
    assert again._demo_reports() == said
    assert ReportImport.objects.count() == 3 and Search.objects.count() == 3


def test_the_first_stop_signal_ignores_any_later_one_before_the_stop_begins():
    """Between the first signal and `_down` (an except clause, a write to a closed pipe) a
    second SIGTERM or Ctrl-C could still raise: the handler ignores both before it returns."""
    from searches.management.commands.up import stop_on_signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGTERM, stop_on_signal)
        signal.signal(signal.SIGINT, stop_on_signal)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: nothing is raised
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
