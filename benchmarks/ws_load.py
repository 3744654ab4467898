"""Live-view load: N websocket clients on one search while trial events arrive at R per second.

The events take the product's own path: `kernels.worker.publish` appends them to the search's
Redis stream (as a GPU worker does), `Loop.forward_events` (the orchestrator's step, run every
orchestrator.POLL_S) applies them to the trial and calls `searches.live`, which renders the row
once, channels-redis fans it out to the search's group, and each client's `SearchConsumer`
checks its user's access and forwards the row. Each event carries a sequence number as its
progress (`verifying 17/1000000`), which the row shows; the clients parse it back. The
orchestrator coalesces progress within a poll (only the newest `i/n` of a trial is rendered), so
an event counts as delivered to a client once a frame shows its number or a later one: that is
when the row the user sees has caught up with it. Latency is publish -> that frame received; an
event no frame ever covers is dropped for that client. (`shown_exactly` counts the events whose
own number reached a client.)

Real daphne (autoweb.asgi) on loopback, DEBUG off; 200 users with real Django sessions.

    python benchmarks/ws_load.py --clients 200 --rate 50 --seconds 30 --out ws.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parents[1]
OF = 1_000_000
SEQ = re.compile(rf"(\d+)/{OF}\b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing listens on {port}")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def setup_django(db_url: str, redis_url: str) -> None:
    os.environ.update(
        DATABASE_URL=db_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="autoweb.settings",
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        AUTOWEB_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_world(n_users: int) -> tuple[int, int, list[str]]:
    """A search with one trial in flight, and n logged-in sessions (session keys)."""
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore

    from searches import services

    User = get_user_model()
    owner = User.objects.create_user("owner", password="pw-ws-load-1")
    services.grant_role(user=owner, role="engineers")
    idea = services.create_idea(
        author=owner,
        title="ws load",
        description="live-view load benchmark",
        problem="softmax",
        target_kinds=["interpret"],
        proposer="tuner",
        sketch_source="",
        prohibitions="",
        max_trials=10,
        max_gpu_minutes=30,
        max_wall_minutes=60,
        max_tokens=None,
    )
    search = services.begin_search(search=services.start_search(idea=idea, user=owner))
    from kernels import problems

    trial = services.record_proposal(
        search=search,
        source=problems.load("softmax").seed_path.read_text(),
        parent=None,
        proposer="tuner",
    )
    trial = services.mark_trial_queued(trial=trial, job_id="ws-load-job")
    keys = []
    for i in range(n_users):
        u = User.objects.create_user(f"viewer{i}", password="pw-ws-load-1")
        services.grant_role(user=u, role="engineers")
        s = SessionStore()
        s[SESSION_KEY] = str(u.pk)
        s[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        s[HASH_SESSION_KEY] = u.get_session_auth_hash()
        s.save()
        keys.append(s.session_key)
    return search.pk, trial.pk, keys


class Client:
    def __init__(self, key: str) -> None:
        self.key = key
        self.got: dict[int, float] = {}
        self.dupes = 0
        self.frames = 0
        self.error: str | None = None
        self.connected = asyncio.Event()


async def run_client(c: Client, url: str, origin: str, stop: asyncio.Event) -> None:
    import websockets

    try:
        async with websockets.connect(
            url,
            additional_headers={"Cookie": f"sessionid={c.key}", "Origin": origin},
            open_timeout=60,
            max_queue=None,
        ) as ws:
            c.connected.set()
            while not stop.is_set():
                try:
                    text = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                now = time.time()
                c.frames += 1
                for m in SEQ.finditer(text):
                    seq = int(m.group(1))
                    if seq in c.got:
                        c.dupes += 1
                    else:
                        c.got[seq] = now
    except Exception as e:  # reported per client
        c.error = f"{type(e).__name__}: {e}"[:200]
        c.connected.set()


def covering(got: dict[int, float], sent: dict[int, float]) -> dict[int, float]:
    """For each published number, when the client first saw it or a later one (None: never)."""
    covered: dict[int, float] = {}
    best: float | None = None
    received = sorted(got.items(), reverse=True)
    i = 0
    for seq in sorted(sent, reverse=True):
        while i < len(received) and received[i][0] >= seq:
            t = received[i][1]
            best = t if best is None else min(best, t)
            i += 1
        if best is not None:
            covered[seq] = best
    return covered


def publisher(redis_url: str, sid: int, tid: int, rate: float, seconds: float, sent: dict) -> None:
    import redis

    from kernels.queues import publish

    conn = redis.Redis.from_url(redis_url)
    period = 1.0 / rate
    start = time.monotonic()
    seq = 0
    while True:
        due = start + seq * period
        if due - start >= seconds:
            break
        time.sleep(max(0.0, due - time.monotonic()))
        seq += 1
        sent[seq] = time.time()
        publish(
            conn,
            sid,
            {"type": "trial_phase", "trial": tid, "phase": "verifying", "shape": seq, "of": OF},
        )


def forwarder(sid: int, tid: int, stop: threading.Event, ready: threading.Event) -> None:
    from django.db import connection

    from searches import live
    from searches.models import Trial
    from searches.orchestrator import POLL_S, Loop

    # A running orchestrator has rendered rows before; a fresh process's first render imports
    # the URL conf (over a second on these 2 cores), which would land on the first events.
    live.render_row(Trial.objects.get(pk=tid))
    ready.set()
    loop = Loop(sid)
    while not stop.is_set():
        loop.forward_events()
        time.sleep(POLL_S)
    connection.close()


async def main_async(args, port: int, sid: int, tid: int, keys: list[str], redis_url: str) -> dict:
    url = f"ws://127.0.0.1:{port}/ws/searches/{sid}/"
    origin = f"http://127.0.0.1:{port}"
    clients = [Client(k) for k in keys]
    stop = asyncio.Event()
    tasks = []
    t0 = time.monotonic()
    for c in clients:  # connect in waves: a real page load spreads them a little too
        tasks.append(asyncio.create_task(run_client(c, url, origin, stop)))
        await asyncio.sleep(0.01)
    await asyncio.gather(*(c.connected.wait() for c in clients))
    connect_s = time.monotonic() - t0
    await asyncio.sleep(2)  # catch-up frames
    sent: dict[int, float] = {}
    fstop = threading.Event()
    ready = threading.Event()
    fwd = threading.Thread(target=forwarder, args=(sid, tid, fstop, ready), daemon=True)
    fwd.start()
    while not ready.is_set():
        await asyncio.sleep(0.05)
    pub = threading.Thread(
        target=publisher, args=(redis_url, sid, tid, args.rate, args.seconds, sent), daemon=True
    )
    pub.start()
    while pub.is_alive():
        await asyncio.sleep(0.2)
    await asyncio.sleep(args.drain)
    stop.set()
    fstop.set()
    await asyncio.gather(*tasks)
    lat, per_client_drop, errors = [], [], []
    n = len(sent)
    exact = 0
    for c in clients:
        if c.error:
            errors.append(c.error)
        covered = covering(c.got, sent)
        exact += sum(1 for s in c.got if s in sent)
        per_client_drop.append(n - len(covered))
        lat.extend((t - sent[s]) * 1000 for s, t in covered.items())
    delivered = n * len(clients) - sum(per_client_drop)
    return {
        "clients": len(clients),
        "clients_failed": len(errors),
        "errors": sorted(set(errors))[:5],
        "connect_all_s": round(connect_s, 2),
        "events_published": n,
        "rate_per_s": args.rate,
        "seconds": args.seconds,
        "drain_s": args.drain,
        "deliveries_expected": n * len(clients),
        "deliveries": delivered,
        "dropped": sum(per_client_drop),
        "dropped_fraction": round(1 - delivered / max(1, n * len(clients)), 4),
        "dropped_per_client_max": max(per_client_drop) if per_client_drop else None,
        "shown_exactly": exact,
        "frames": sum(c.frames for c in clients),
        "duplicates": sum(c.dupes for c in clients),
        "latency_ms": {
            "p50": pct(lat, 0.50),
            "p95": pct(lat, 0.95),
            "p99": pct(lat, 0.99),
            "max": max(lat) if lat else None,
            "mean": statistics.fmean(lat) if lat else None,
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--rate", type=float, default=50.0, help="events per second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--drain", type=float, default=15.0, help="seconds to wait after the last")
    ap.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ws-load-"))
    rport = free_port()
    redis_proc = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    daphne = None
    try:
        wait_port(rport)
        redis_url = f"redis://127.0.0.1:{rport}/0"
        db_url = args.database_url or f"sqlite:///{tmp / 'db.sqlite3'}"
        setup_django(db_url, redis_url)
        sid, tid, keys = make_world(args.clients)
        port = free_port()
        daphne = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
            + ["autoweb.asgi:application"],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=open(tmp / "daphne.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        wait_port(port)
        result = asyncio.run(main_async(args, port, sid, tid, keys, redis_url))
        result["database"] = "postgresql" if db_url.startswith("postgres") else "sqlite"
        result["loadavg_after"] = os.getloadavg()
        print(json.dumps(result, indent=2))
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if daphne is not None:
            daphne.terminate()
            daphne.wait(timeout=30)
        redis_proc.terminate()
        redis_proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
