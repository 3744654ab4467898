"""`manage.py up` (what `make run` calls): the whole app in one command.

Migrates, creates (or refreshes) a demo user and prints its login, starts an embedded Redis
server when REDIS_URL is unset (a real redis-server process on a free port, in a private
directory, persisting nothing), then daphne (HTTP + websockets), the orchestrator (`search`
queue) and the local GPU workers (CUDA if present: `--workers-per-gpu` for each visible GPU,
default 4, each pinned to its GPU with CUDA_VISIBLE_DEVICES, so that one candidate compiles and
verifies while another is timed under the GPU's lock; else one on Triton's CPU interpreter),
starts a demo tuner search on softmax, imports a few real H200 reports to review (DEMO_REPORTS;
a restart imports nothing again), and prints the URL. Ctrl-C stops every process it started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

DEMO_USER = "demo"
RESTARTS_MAX = 5
RESTARTS_WINDOW_S = 60.0
DEMO_TITLE = "Demo: tune the softmax seed's knobs"
# Real H200 reports (docs/benchmarks/h200/) imported at start, so that a machine without a GPU
# has candidates to review: tuned softmax, rmsnorm and layernorm kernels, each faster than
# eager and torch.compile beyond its noise. Approving one waits for an h200 worker.
DEMO_REPORTS = (
    ("docs/benchmarks/h200/proof-2026-12-02-c.json", ("softmax", "rmsnorm", "layernorm")),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_on_signal(signum: int, frame: object) -> None:
    """SIGTERM or SIGINT: stop everything. Later ones are ignored from this moment, before the
    stop begins, so none can interrupt it (not even between this handler and `_down`)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Start everything: Redis (embedded if REDIS_URL is unset), web, orchestrator, worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("AUTOWEB_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--device", default="auto", choices=["auto", "cuda", "interpret"])
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="GPU worker processes in all (default: --workers-per-gpu for each visible CUDA "
            "GPU, else 1); with more workers than GPUs they share GPUs round-robin",
        )
        parser.add_argument(
            "--workers-per-gpu",
            type=int,
            default=settings.AUTOWEB_WORKERS_PER_GPU,
            help="worker processes sharing each GPU when --workers is not given (default 4, "
            "or AUTOWEB_WORKERS_PER_GPU): timing holds the GPU alone, the rest overlaps",
        )
        parser.add_argument(
            "--orchestrators", type=int, default=1, help="orchestrator processes (default 1)"
        )
        parser.add_argument("--no-demo", action="store_true", help="no demo search")
        parser.add_argument(
            "--run-for", type=float, default=None, help="stop after this many seconds (tests)"
        )

    def handle(self, *args, host, port, device, workers, orchestrators, no_demo, run_for, **opts):
        if workers is not None and workers < 1:
            raise CommandError("--workers must be at least 1")
        if opts["workers_per_gpu"] < 1:
            raise CommandError("--workers-per-gpu must be at least 1")
        self.per_gpu = opts["workers_per_gpu"]
        if orchestrators < 1:
            raise CommandError("--orchestrators must be at least 1")
        self.n_workers, self.n_orchestrators = workers, orchestrators
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.specs: dict[str, tuple[list[str], dict]] = {}
        self.restarts: dict[str, list[float]] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="autoweb-up-"))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop_on_signal)
        try:
            self._up(host, port, device, no_demo, run_for)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping ...")
        finally:
            self._down()

    # -- start ----------------------------------------------------------------------------------

    def _up(self, host, port, device, no_demo, run_for) -> None:
        env = dict(os.environ)
        if not os.environ.get("REDIS_URL"):
            env["REDIS_URL"] = self._embedded_redis()
        settings.REDIS_URL = env["REDIS_URL"]
        settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"] = env["REDIS_URL"]
        call_command("migrate", interactive=False, verbosity=0)
        password = self._demo_user()
        py = sys.executable
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        self._spawn(
            "web",
            [py, "-m", "daphne", "-b", host, "-p", str(port), "autoweb.asgi:application"],
            env,
        )
        for i in range(self.n_orchestrators):
            self._spawn(f"orchestrator{i}", [py, manage, "orchestrator"], env)
        kind = self._kind(device)
        names = self._spawn_workers(py, device, kind, env)
        demo = ""
        if not no_demo:
            self._demo_search(kind)
            demo = f"\n  review queue: {self._demo_reports()}"
        url = f"http://{host}:{port}/"
        self.stdout.write(
            self.style.SUCCESS(
                f"\nautoweb is up: {url}\n  login: {DEMO_USER} / {password}\n"
                f"  redis: {env['REDIS_URL']}\n  workers: {', '.join(names)} ({kind})"
                + (
                    " (CPU interpreter: correctness only, timings not meaningful)"
                    if kind == "interpret"
                    else ""
                )
                + demo
                + "\n  Ctrl-C stops everything.\n"
            )
        )
        started = time.monotonic()
        while True:
            for i, (name, p) in enumerate(self.procs):
                if p.poll() is not None:
                    self.procs[i] = (name, self._restart(name, p.returncode))
            if run_for is not None and time.monotonic() - started > run_for:
                return
            time.sleep(0.5)

    def _embedded_redis(self) -> str:
        exe = shutil.which("redis-server")
        if not exe:
            raise CommandError(
                "REDIS_URL is unset and no redis-server is on PATH: install "
                "Redis (e.g. apt-get install redis-server) or set REDIS_URL"
            )
        port = free_port()
        self._spawn(
            "redis",
            [
                exe,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            dict(os.environ),
        )
        import redis

        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                return url
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise CommandError("the embedded redis-server did not start") from None
                time.sleep(0.1)

    def _spawn_workers(self, py: str, device: str, kind: str, env: dict) -> list[str]:
        """`per_gpu` workers per visible GPU by default, each pinned with CUDA_VISIBLE_DEVICES."""
        if kind == "interpret":
            gpus: list[str | None] = [None]
        else:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                gpus = [g.strip() for g in visible.split(",") if g.strip()]
            else:
                import torch

                gpus = [str(i) for i in range(torch.cuda.device_count())]
        n = self.n_workers or len(gpus) * (1 if kind == "interpret" else self.per_gpu)
        host = socket.gethostname()
        names = []
        for i in range(n):
            gpu = gpus[i % len(gpus)]
            wenv = dict(env)
            if gpu is None:
                name = f"{host}:interpret" + (f".{i}" if n > 1 else "")
            else:
                wenv["CUDA_VISIBLE_DEVICES"] = gpu
                name = f"{host}:gpu{gpu}" + (f".{i // len(gpus)}" if n > len(gpus) else "")
            dev = "interpret" if gpu is None else "cuda"
            self._spawn(
                f"worker {name}",
                [py, "-m", "kernels.worker", "--device", dev, "--name", name],
                wenv,
            )
            names.append(name)
        return names

    def _spawn(self, name: str, cmd: list[str], env: dict) -> None:
        p = subprocess.Popen(cmd, env=env, cwd=settings.BASE_DIR, start_new_session=True)
        self.procs.append((name, p))
        self.specs[name] = (cmd, env)

    def _restart(self, name: str, code: int) -> subprocess.Popen:
        """Workers and orchestrators are restarted when they die (their work is recovered from
        Redis and the database); Redis or the web server dying stops everything, as does a
        process that keeps dying (RESTARTS_MAX times within RESTARTS_WINDOW_S)."""
        if not name.startswith(("worker", "orchestrator")):
            raise CommandError(f"{name} exited with code {code}; see its output")
        now = time.monotonic()
        recent = [t for t in self.restarts.get(name, []) if now - t < RESTARTS_WINDOW_S]
        if len(recent) >= RESTARTS_MAX:
            raise CommandError(
                f"{name} exited with code {code}, {len(recent)} times in "
                f"{RESTARTS_WINDOW_S:.0f} s; see its output"
            )
        self.restarts[name] = [*recent, now]
        self.stderr.write(f"{name} exited with code {code}; restarting it")
        cmd, env = self.specs[name]
        return subprocess.Popen(cmd, env=env, cwd=settings.BASE_DIR, start_new_session=True)

    def _demo_user(self) -> str:
        from searches import services

        User = get_user_model()
        user, _ = User.objects.get_or_create(username=DEMO_USER)
        # The same password across restarts (a browser stays logged in): AUTOWEB_DEMO_PASSWORD,
        # else the one kept in var/ when it still opens this database's demo user.
        kept = Path(settings.VAR_DIR) / "demo-password"
        password = os.environ.get("AUTOWEB_DEMO_PASSWORD")
        if not password and kept.is_file():
            candidate = kept.read_text().strip()
            if candidate and user.check_password(candidate):
                password = candidate
        if not password:
            password = secrets.token_urlsafe(9)
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.touch(mode=0o600)
            kept.write_text(password + "\n")
        if not user.check_password(password):
            user.set_password(password)
        user.is_staff = True
        user.save()
        for role in ("engineers", "reviewers"):
            services.grant_role(user=user, role=role)
        # The admin is where roles are given: the demo user may view users and groups and
        # change a user's groups there (no more: it is not a superuser).
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="auth",
                codename__in=("view_user", "change_user", "view_group"),
            )
        )
        return password

    def _kind(self, device: str) -> str:
        from kernels.harness import device as devmod

        dev = devmod.resolve(device)
        return "interpret" if dev == "interpret" else devmod.info(dev, False)["kind"]

    def _demo_search(self, kind: str) -> None:
        from searches import orchestrator, services
        from searches.models import Idea, Search

        user = get_user_model().objects.get(username=DEMO_USER)
        # One demo search per GPU kind, ever: a restart resumes it (or leaves it finished).
        demos = Search.objects.filter(idea__title=DEMO_TITLE).select_related("idea")
        if any(kind in (s.idea.target_kinds or []) for s in demos):
            return
        with transaction.atomic():
            idea = Idea.objects.filter(title=DEMO_TITLE, target_kinds=[kind]).first()
            if idea is None:
                idea = services.create_idea(
                    author=user,
                    title=DEMO_TITLE,
                    description="The built-in tuner walks the `# tune:` knobs of the softmax "
                    "seed kernel; every candidate is verified and benchmarked by the harness.",
                    problem="softmax",
                    target_kinds=[kind],
                    proposer="tuner",
                    sketch_source="",
                    prohibitions="",
                    max_trials=30,
                    max_gpu_minutes=30,
                    max_wall_minutes=60,
                    max_tokens=None,
                )
            search = services.start_search(idea=idea, user=user)
            orchestrator.enqueue_search(search)

    def _demo_reports(self) -> str:
        """Import DEMO_REPORTS as the demo user (again: no change); says what came in. (The
        review queue is the library app's, which this app does not import: the reports are
        accepted and faster than both baselines, so they wait there.)"""
        from searches import imports

        user = get_user_model().objects.get(username=DEMO_USER)
        trials = []
        for path, problems in DEMO_REPORTS:
            outcome = imports.import_file(
                Path(settings.BASE_DIR) / path, user=user, problems=list(problems)
            )
            trials += [*outcome.imported, *outcome.already]
        names = ", ".join(sorted(t.search.idea.problem for t in trials))
        return f"{len(trials)} imported H200 reports to review ({names})"

    # -- stop -----------------------------------------------------------------------------------

    def _down(self) -> None:
        # Finish whatever signals arrive meanwhile: a second SIGTERM or Ctrl-C must not leave
        # half the processes running (`stop_on_signal` ignores them from the first one on; this
        # covers a stop without a signal: --run-for, a failed start).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        # Every process below ours, taken before anything stops: a worker's sandboxes run in
        # sessions of their own and would outlive a worker that dies first.
        below: list[psutil.Process] = []
        for _, p in self.procs:
            with contextlib.suppress(psutil.Error):
                below += psutil.Process(p.pid).children(recursive=True)
        # In reverse start order, each waited for: Redis goes last, after its clients.
        for _, p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        # Anything a child left behind in its session (sandboxes are their own sessions and
        # die with their parent's kill; this is the belt and braces).
        for proc in below:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for _, p in self.procs:
            with contextlib.suppress(psutil.Error):
                psutil.Process(p.pid).kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
