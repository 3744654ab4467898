"""The whole product on one host, measured: `manage.py up` (embedded Redis, web, orchestrators,
GPU workers) serves tuner searches with fixed trial budgets; this script submits them through
the domain services, logs in over HTTP, waits, and reports trials per minute, verdicts, and
whether any trial was lost or evaluated twice. Optionally SIGKILLs one worker mid-search.

    python benchmarks/stack_proof.py --device cuda --workers 2 --trials 8 --out stack.json
    python benchmarks/stack_proof.py --device interpret --workers 1 --trials 3   # on a CPU
    python benchmarks/stack_proof.py --device interpret --workers 2 --orchestrators 2 \
        --searches 20 --trials 3                          # 20 searches at once (load)
    python benchmarks/stack_proof.py --device cuda --problems rmsnorm,swiglu,rope \
        --trials 16 --release var/library                 # then approve, re-validate, export
    python benchmarks/stack_proof.py --device cuda --problems rmsnorm,swiglu,rope \
        --sketches tests/fixtures/honest --trials 12 --release var/library   # from sketches
    python benchmarks/stack_proof.py --device cuda --problems-dir benchmarks/user_problems \
        --problems token_logprobs --sketches benchmarks/user_problems/seeds --searches 2 \
        --trials 60                                       # a user's problem, from its seed

With `--release DIR`, once the searches end, a reviewer approves every incumbent that is in the
review queue (over the shape range it was measured on), the workers re-validate it as they
would after a reviewer's click, and the releases are exported to DIR (`export_library`), the
library that benchmarks/model_block.py loads.

Redis comes from `up` (a redis-server on PATH); the database is a fresh SQLite file.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "stack-proof-pw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


class App:
    """`manage.py up` in a subprocess; its output is echoed with a prefix and scanned."""

    def __init__(self, args, db: Path) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
        env.update(
            DATABASE_URL=f"sqlite:///{db}",
            PYTHONUNBUFFERED="1",
            AUTOWEB_DEMO_PASSWORD=PASSWORD,
        )
        cmd = [sys.executable, "manage.py", "up", "--no-demo", "--port", str(self.port)]
        cmd += ["--device", args.device]
        if args.workers:
            cmd += ["--workers", str(args.workers)]
        cmd += ["--orchestrators", str(args.orchestrators)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.redis_url: str | None = None
        self.kind: str | None = None
        self.worker_names: list[str] = []
        self.ready = threading.Event()
        self.tail: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.tail = (self.tail + [line])[-200:]
            if m := re.search(r"redis: (redis://\S+)", line):
                self.redis_url = m.group(1)
            if m := re.search(r"workers: (.*) \((\S+)\)", line):
                self.worker_names = [n.strip() for n in m.group(1).split(",")]
                self.kind = m.group(2)
                self.ready.set()
            if not line.startswith(("[", "  ")) or "error" in line.lower():
                print("  up|", line.rstrip(), flush=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the app did not come up:\n" + "".join(self.tail[-40:]))

    def workers(self) -> list[tuple[int, str]]:
        import psutil

        found = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if "kernels.worker" in cmd and "--name" in cmd:
                found.append((p.pid, cmd[cmd.index("--name") + 1]))
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def web_check(port: int, search_ids: list[int]) -> dict:
    """Log in as the demo user the way a browser does and open each search page."""
    base = f"http://127.0.0.1:{port}"
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/accounts/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode(
        {"username": "demo", "password": PASSWORD, "csrfmiddlewaretoken": token}
    ).encode()
    req = urllib.request.Request(f"{base}/accounts/login/", data=data, headers={"Referer": base})
    opener.open(req, timeout=10).read()
    out = {}
    for sid in search_ids:
        t0 = time.perf_counter()
        with opener.open(f"{base}/searches/{sid}", timeout=30) as r:
            body = r.read().decode()
            out[sid] = {
                "status": r.status,
                "ms": round((time.perf_counter() - t0) * 1000, 1),
                "logged_in": "/accounts/login/" not in r.geturl(),
                "bytes": len(body),
            }
    return out


SHAPE_KEYS = ("label", "passed", "timing_mode", "candidate_ms", "eager_ms", "compiled_ms")
SHAPE_KEYS += ("speedup_eager", "speedup_compiled", "win_eager", "win_compiled")
SHAPE_KEYS += ("gbps", "roofline_fraction", "bound")


def _shape_rows(trial) -> list[dict]:
    """The incumbent's per-shape results, as its report has them."""
    if trial is None or not trial.report:
        return []
    return [{k: row.get(k) for k in SHAPE_KEYS} for row in trial.report.get("shapes") or []]


def warm_baselines(names: list[str], conn) -> float:
    """Measure each problem's baselines into the cache the workers read (this host's disk and
    the app's Redis), in a sandbox of this process."""
    from kernels import problems
    from kernels.harness import BaselineCache, measure_baselines
    from kernels.harness import baselines as bl
    from kernels.harness import device as devmod

    t0 = time.perf_counter()
    cache = BaselineCache(redis=conn)
    info = devmod.info("cuda")
    for name in dict.fromkeys(names):
        problem = problems.load(name)
        shapes = problem.shapes("full")
        dtype = str(problem.dtype("cuda")).replace("torch.", "")
        fields = bl.key_fields(problem, info, dtype)
        labels = [problems.shape_label(s) for s in shapes]
        if cache.get(fields, labels) is None:
            cache.put(fields, labels, measure_baselines(problem, shapes, device="cuda"))
    return time.perf_counter() - t0


def _where_time_went(trials) -> dict:
    """Where a search's evaluations spent their time: the baselines' source (cached, measured,
    re-measured after a canary drift) and the median second at which each harness phase began."""
    sources: dict[str, int] = {}
    phases: dict[str, list[float]] = {}
    for t in trials:
        rep = t.report or {}
        src = (rep.get("baselines") or {}).get("source")
        if src:
            sources[src] = sources.get(src, 0) + 1
        for name, sec in (rep.get("timeline") or {}).items():
            if isinstance(sec, (int, float)):
                phases.setdefault(name, []).append(float(sec))
    return {
        "baseline_sources": sources,
        "timeline_median_s": {n: round(statistics.median(v), 3) for n, v in phases.items()},
    }


def worker_use(conn, kind: str, n_workers: int, t0: float, t1: float) -> dict:
    """How the GPU workers spent the window [t0, t1] (epoch seconds), from RQ's own record of
    every job they finished or failed (evaluations, re-times, tables): the fraction of the
    workers' time spent running jobs, the seconds from one job's end to the same worker's next
    start, and the seconds jobs waited in the queue. Idle workers with jobs waiting would mean
    the orchestration, not the GPU, bounds the trials per minute."""
    from rq.exceptions import NoSuchJobError
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    from kernels.protocol import queue_name
    from kernels.queues import fetch_job, rq_queue

    q = rq_queue(queue_name(kind), conn)
    ids = FinishedJobRegistry(queue=q).get_job_ids() + FailedJobRegistry(queue=q).get_job_ids()
    runs: dict[str, list[tuple[float, float]]] = {}
    waits: list[float] = []
    for job_id in ids:
        try:
            job = fetch_job(job_id, conn)
        except NoSuchJobError:
            continue
        if not (job.started_at and job.ended_at and job.worker_name):
            continue
        start, end = job.started_at.timestamp(), job.ended_at.timestamp()
        runs.setdefault(job.worker_name, []).append((start, end))
        if job.enqueued_at and t0 <= start <= t1:
            waits.append(start - job.enqueued_at.timestamp())
    busy = 0.0
    gaps: list[float] = []
    for spans in runs.values():
        spans.sort()
        busy += sum(max(0.0, min(end, t1) - max(start, t0)) for start, end in spans)
        gaps += [b[0] - a[1] for a, b in itertools.pairwise(spans) if t0 <= a[1] and b[0] <= t1]

    def quantiles(xs: list[float]) -> dict:
        xs = sorted(xs)
        if not xs:
            return {"n": 0}
        return {
            "n": len(xs),
            "median": round(xs[len(xs) // 2], 3),
            "p90": round(xs[int(0.9 * (len(xs) - 1))], 3),
            "max": round(xs[-1], 3),
        }

    window = max(t1 - t0, 1e-9)
    return {
        "jobs": sum(1 for v in runs.values() for start, end in v if start < t1 and end > t0),
        "busy_fraction": round(busy / (max(n_workers, 1) * window), 3),
        "gap_between_jobs_s": quantiles(gaps),
        "queue_wait_s": quantiles(waits),
    }


def release(search_ids: list[int], user, out: Path, timeout: float) -> dict:
    """Approve each search's incumbent that waits for review, as a reviewer would; wait for the
    workers' re-validations; export the active releases to `out`."""
    from django.contrib.auth.models import Group
    from django.core.management import call_command

    from library import selectors as library_selectors
    from library import services as library_services
    from library.models import Release, Revalidation, Review
    from searches.models import Search

    user.groups.add(Group.objects.get_or_create(name="reviewers")[0])
    approved, skipped = [], []
    for s in Search.objects.filter(pk__in=search_ids).select_related("incumbent", "idea"):
        trial = s.incumbent
        why = "no incumbent" if trial is None else library_selectors.why_not_candidate(trial)
        if why is not None:
            skipped.append({"search": s.pk, "problem": s.idea.problem, "why": why})
            continue
        review = library_services.decide(
            trial=trial,
            user=user,
            action="approve",
            text="approved by benchmarks/stack_proof.py --release",
            shape_range=library_services.measured_range(trial),
        )
        approved.append({"search": s.pk, "problem": s.idea.problem, "review": review.pk})
    log(f"approved {approved}; not in the queue: {skipped}")
    reviews = [a["review"] for a in approved]
    deadline = time.monotonic() + timeout
    # The orchestrator's watcher records the workers' results in its turns on the `search`
    # queue; this loop also records them itself, with the function the watcher calls
    # (library.services.poll), so the figure does not wait on the orchestrator's queue.
    while Revalidation.objects.filter(
        review__in=reviews, status=Revalidation.Status.QUEUED
    ).exists():
        for review in Review.objects.filter(pk__in=reviews):
            library_services.poll(review=review)
        if time.monotonic() > deadline:
            log("re-validation timed out")
            break
        time.sleep(2.0)
    revals = [
        {
            "review": r.review_id,
            "problem": r.review.trial.search.idea.problem,
            "kind": r.kind,
            "status": r.status,
            "reasons": r.reasons,
        }
        for r in Revalidation.objects.filter(review__in=reviews).select_related(
            "review__trial__search__idea"
        )
    ]
    out.mkdir(parents=True, exist_ok=True)
    call_command("export_library", out=str(out))
    releases = [
        {
            "id": r.pk,
            "problem": r.problem,
            "kind": r.kind,
            "dtype": r.dtype,
            "shape_range": r.shape_range,
            "speedup_eager": r.speedup_eager,
            "speedup_compiled": r.speedup_compiled,
        }
        for r in Release.objects.filter(revoked_at__isnull=True)
    ]
    log(f"releases {releases} exported to {out}")
    return {"approved": approved, "skipped": skipped, "revalidations": revals, "releases": releases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "interpret"])
    ap.add_argument(
        "--workers", type=int, default=None, help="default: what `up` starts (per visible GPU)"
    )
    ap.add_argument(
        "--warm-baselines",
        action="store_true",
        help="measure the problems' baselines into the workers' cache before the searches, as an "
        "earlier search on this GPU would have (the time it takes is reported apart)",
    )
    ap.add_argument("--orchestrators", type=int, default=1)
    ap.add_argument("--problems", default="softmax,rmsnorm")
    ap.add_argument(
        "--sketches",
        type=Path,
        default=None,
        metavar="DIR",
        help="an engineer's structural sketch per problem, DIR/<problem>_tuned.py or else "
        "DIR/<problem>.py where present (e.g. tests/fixtures/honest): the idea's start instead "
        "of the built-in seed",
    )
    ap.add_argument(
        "--problems-dir",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="users' problem modules (AUTOWEB_PROBLEM_DIRS for this script and the app)",
    )
    ap.add_argument("--trials", type=int, default=8, help="trial budget per search")
    ap.add_argument(
        "--searches",
        type=int,
        default=0,
        help="searches started at once, cycling over --problems (0: one per problem)",
    )
    ap.add_argument(
        "--kill-worker-after",
        type=int,
        default=0,
        metavar="N",
        help="SIGKILL one worker once N trials have finished (0: never)",
    )
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the searches")
    ap.add_argument(
        "--release",
        type=Path,
        default=None,
        metavar="DIR",
        help="approve each incumbent in the review queue, wait for re-validation, export to DIR",
    )
    ap.add_argument(
        "--release-timeout", type=float, default=240, help="seconds for the re-validations"
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--keep-db", type=Path, default=None, metavar="PATH", help="copy the database file here"
    )
    args = ap.parse_args(argv)
    for d in args.problems_dir:
        if not d.is_dir():
            ap.error(f"--problems-dir {d}: no such directory")
    if args.problems_dir:
        os.environ["AUTOWEB_PROBLEM_DIRS"] = os.pathsep.join(
            str(d.resolve()) for d in args.problems_dir
        )

    tmp = Path(tempfile.mkdtemp(prefix="autoweb-stack-"))
    db = tmp / "stack.sqlite3"
    app = App(args, db)
    result: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    try:
        app.wait_ready(240)
        os.environ["DATABASE_URL"] = f"sqlite:///{db}"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "autoweb.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.db import transaction

        settings.REDIS_URL = app.redis_url
        from core import control
        from searches import orchestrator, services
        from searches.models import Search, Trial

        user = get_user_model().objects.get(username="demo")
        kind = app.kind
        # Let every worker register (heartbeat) so the orchestrator sees its capacity.
        conn = control.redis_conn()
        deadline = time.monotonic() + 120
        while len(conn.smembers("autoweb:workers")) < len(app.worker_names):
            if time.monotonic() > deadline:
                raise SystemExit("not every worker registered")
            time.sleep(0.5)
        log(f"up: kind {kind}, workers {[n for _, n in app.workers()]}, redis {app.redis_url}")

        if args.warm_baselines and kind != "interpret":
            result["warm_baselines_s"] = warm_baselines(args.problems.split(","), conn)
            log(f"baselines measured in {result['warm_baselines_s']:.1f} s")
        searches = []
        t_start = time.time()
        names = args.problems.split(",")
        if args.searches:
            names = [names[i % len(names)] for i in range(args.searches)]
        for n_search, name in enumerate(names, 1):
            sketch = None
            if args.sketches:
                sketch = args.sketches / f"{name}_tuned.py"
                if not sketch.exists():
                    sketch = args.sketches / f"{name}.py"
            idea = services.create_idea(
                author=user,
                title=f"stack proof {n_search}: {name} knobs",
                description="Fixed trial budget, built-in tuner.",
                problem=name,
                target_kinds=[kind],
                proposer="tuner",
                sketch_source=sketch.read_text() if sketch and sketch.exists() else "",
                prohibitions="",
                max_trials=args.trials,
                max_gpu_minutes=60,
                max_wall_minutes=60,
                max_tokens=None,
            )
            with transaction.atomic():
                s = services.start_search(idea=idea, user=user, seed=1)
                orchestrator.enqueue_search(s)
            searches.append(s.pk)
        log(f"started searches {searches}")

        killed = None
        deadline = time.monotonic() + args.timeout
        last = -1
        while True:
            qs = Search.objects.filter(pk__in=searches)
            done = Trial.objects.filter(search__in=searches, status__in=Trial.TERMINAL).count()
            if done != last:
                log(f"{done} trials finished; " + ", ".join(f"{s.pk}:{s.status}" for s in qs))
                last = done
            if args.kill_worker_after and killed is None and done >= args.kill_worker_after:
                pid, name = app.workers()[0]
                os.kill(pid, signal.SIGKILL)
                killed = {"worker": name, "pid": pid, "after_trials": done, "at": time.time()}
                log(f"SIGKILL worker {name} (pid {pid})")
            if all(s.status in (Search.Status.FINISHED, Search.Status.FAILED) for s in qs):
                break
            if time.monotonic() > deadline:
                log("timed out")
                result["timed_out"] = True
                break
            time.sleep(1.0)

        try:
            result["web"] = web_check(app.port, searches)
        except OSError as e:
            result["web"] = {"error": repr(e)}
        trials = list(Trial.objects.filter(search__in=searches).order_by("pk"))
        terminal = [t for t in trials if t.status in Trial.TERMINAL]
        started = [t.queued_at or t.created_at for t in trials]
        finished = [t.finished_at for t in terminal if t.finished_at]
        wall = (max(finished) - min(started)).total_seconds() if finished else None
        # A trial's gpu_seconds is its evaluation job's run time on the worker.
        durations = [t.gpu_seconds for t in terminal if t.gpu_seconds]
        dupes = 0
        gaps = 0
        for sid in searches:
            shas = [t.source_sha256 for t in trials if t.search_id == sid]
            dupes += len(shas) - len(set(shas))
            # Trial indices are 1..n with none missing or repeated: nothing lost in between.
            idx = sorted(t.index for t in trials if t.search_id == sid)
            gaps += idx != list(range(1, len(idx) + 1))
        by_worker: dict[str, int] = {}
        for t in terminal:
            w = (t.report or {}).get("worker") or "-"
            by_worker[w] = by_worker.get(w, 0) + 1
        result.update(
            kind=kind,
            workers=app.worker_names,
            searches=[
                {
                    "id": s.pk,
                    "problem": s.idea.problem,
                    "status": s.status,
                    "stop_reason": s.stop_reason,
                    "trials": s.trials_total,
                    "kept": s.trials_kept,
                    "failed": s.trials_failed,
                    "incumbent_speedup_eager": (
                        s.incumbent.speedup_eager if s.incumbent_id else None
                    ),
                    "incumbent_speedup_compiled": (
                        s.incumbent.speedup_compiled if s.incumbent_id else None
                    ),
                    "failures": sorted(
                        {t.failure for t in trials if t.search_id == s.pk and t.failure}
                    ),
                    "incumbent_shapes": _shape_rows(s.incumbent),
                    "strategy": s.strategy,
                    "skipped": s.skipped,
                    "table": s.table,
                    "confirmations": sum(
                        1 for t in trials if t.search_id == s.pk and t.confirmation
                    ),
                    **_where_time_went([t for t in trials if t.search_id == s.pk]),
                }
                for s in Search.objects.filter(pk__in=searches).select_related("incumbent", "idea")
            ],
            trials=len(trials),
            terminal=len(terminal),
            # Not judged when the run ended: in flight at a time limit, or lost if none was hit.
            unfinished=len(trials) - len(terminal),
            duplicates=dupes,
            searches_with_index_gaps=gaps,
            over_budget=sum(
                1 for s in Search.objects.filter(pk__in=searches) if s.trials_total > args.trials
            ),
            retried=sum(1 for t in trials if t.attempts > 1),
            by_worker=by_worker,
            wall_s=wall,
            trials_per_min=(len(terminal) / wall * 60) if wall else None,
            eval_s_median=statistics.median(durations) if durations else None,
            gpu_seconds=sum(t.gpu_seconds for t in trials),
            workers_in_window=(
                worker_use(
                    conn,
                    kind,
                    len(app.worker_names),
                    min(started).timestamp(),
                    max(finished).timestamp(),
                )
                if finished
                else None
            ),
            killed=killed,
            since_start_s=time.time() - t_start,
        )
        if args.release:
            result["release"] = release(searches, user, args.release, args.release_timeout)
    finally:
        app.stop()
        if args.keep_db and db.exists():
            shutil.copyfile(db, args.keep_db)
    log(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=1, default=str))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    ok = (
        not result.get("timed_out")
        and result.get("unfinished") == 0
        and result.get("duplicates") == 0
        and all(s["status"] == "finished" for s in result.get("searches", []))
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
