"""`manage.py up` (the README's first command) starts everything and stops everything."""

from __future__ import annotations

import os
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
                        trials = c.execute(
                            "select count(*) from searches_trial where status in "
                            "('kept','reverted','failed')"
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
    time.sleep(1)
    alive = [
        p
        for p in seen
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive, f"processes left running: {alive}"
