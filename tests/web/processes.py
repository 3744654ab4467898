"""Real processes for end-to-end tests: the orchestrator and GPU workers as the product runs
them (`manage.py orchestrator`, `python -m kernels.worker`), on the test's database and Redis.

Each process writes to its own log file (a pipe nobody reads would block a chatty process),
starts in its own session, and is SIGKILLed with its whole group at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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
