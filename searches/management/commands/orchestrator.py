"""`manage.py orchestrator`: the Django-aware worker of the `search` queue."""

from __future__ import annotations

import os
import threading

import redis
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from core import control
from kernels.queues import QueueWorker, serve
from searches.orchestrator import SWEEP_S, sweep


class Command(BaseCommand):
    help = "Serve the `search` queue: drive searches (propose, enqueue, record, keep/revert)."

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="exit when the queue is empty")

    def handle(self, *args, burst: bool = False, **options):
        conn = control.redis_conn()
        # What each app registered in its AppConfig.ready(): searches' loops, reviews' watchers.
        for what, n in control.recover().items():
            self.stdout.write(f"orchestrator: resuming {n} {what}", ending="\n")
        self.stdout.flush()
        stop = threading.Event()
        threading.Thread(target=_sweeper, args=(stop,), daemon=True).start()

        # No fork per job: the loop is light, and Django's connections stay in one process.
        def make_worker(attempt: int) -> QueueWorker:
            return QueueWorker(
                [control.search_queue(conn)],
                connection=conn,
                name=f"orchestrator-{os.getpid()}-{attempt}",
            )

        def resume() -> None:
            # The jobs Redis lost with its restart: every search's loop and review's watcher is
            # enqueued again, as at start-up (searches would also come back through the sweep).
            try:
                control.recover()
            except redis.RedisError:
                raise
            except Exception as e:  # the database restarting too: the sweep catches up
                self.stderr.write(f"orchestrator: resuming after Redis came back failed: {e}")

        # A Redis restart must not end it (`serve`).
        try:
            serve(make_worker, conn, burst=burst, name="orchestrator", on_reconnect=resume)
        finally:
            stop.set()


def _sweeper(stop: threading.Event) -> None:
    """Pick up searches whose loop died with another orchestrator process."""
    while not stop.wait(SWEEP_S + 1):
        try:
            sweep(control.redis_conn())
        except Exception:  # Redis or the database restarting: try again next round
            pass
        finally:
            close_old_connections()
