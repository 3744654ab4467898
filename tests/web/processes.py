"""Real processes for end-to-end tests: the orchestrator and GPU workers as the product runs
them (`manage.py orchestrator`, `python -m kernels.worker`), on the test's database and Redis,
and a private `redis-server` for tests that restart it or give it an ACL file.

Each process writes to its own log file (a pipe nobody reads would block a chatty process),
starts in its own session, and is SIGKILLed with its whole group at the end."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """DATABASE_URL naming the database this test runs on (SQLite file or PostgreSQL)."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    host = f"{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}"
    return f"postgres://{s['USER'] or 'postgres'}@{host}/{s['NAME']}"


class Processes:
    """Starts `python <cmd>` from the project root with the stack's environment."""

    def __init__(self, redis_url: str, logs: Path, **extra_env: str) -> None:
        self.logs = logs
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "DATABASE_URL": test_database_url(),
            "DJANGO_SETTINGS_MODULE": "autoweb.settings",
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        self.procs: list[subprocess.Popen] = []

    def start(self, *cmd: str) -> subprocess.Popen:
        log = self.logs / f"proc{len(self.procs)}.log"
        with open(log, "w") as out:
            p = subprocess.Popen(
                [sys.executable, *cmd],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(p)
        return p

    def log_tails(self, n: int = 3000) -> str:
        """The end of every process's log, for a failing assertion's message."""
        return "".join(
            f"--- {p.name}\n{p.read_text()[-n:]}" for p in sorted(self.logs.glob("proc*.log"))
        )

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server that keeps nothing on disk; stop() and start() on one port."""

    def __init__(self, tmp: Path, *args: str) -> None:
        exe = shutil.which("redis-server")
        if not exe:
            pytest.skip("no redis-server on PATH")
        self.exe, self.tmp, self.port = exe, tmp, _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.args = args  # more redis-server options (an --aclfile, say)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no", "--dir", str(self.tmp), *self.args],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port).ping()
                return
            except redis.AuthenticationError:  # up, and the default user is off (an ACL file)
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
