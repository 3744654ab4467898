"""Server time of the main pages with 10,000 trials (and 1,000 releases when the library app is
installed), measured in-process with Django's test Client: the full request/response cycle
(middleware, auth, queries, templates), no network, no browser. Warm: each page is fetched a few
times before N timed fetches.

Trials are bulk-inserted (realistic rows: the H200 harness report of the softmax seed in every
trial, real sources, a mix of kept / reverted / failed); the searches and idea come from the
services. Two searches: one with 90% of the trials (the search page's worst case), one with 1,000.

    python benchmarks/page_load.py --n 50 --out pages-sqlite.json
    python benchmarks/page_load.py --database-url postgres://postgres@127.0.0.1:5432/bench --n 50
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "benchmarks" / "h200" / "cli-softmax-seed-full.json"


def setup(db_url: str) -> None:
    os.environ.update(
        DATABASE_URL=db_url,
        DJANGO_SETTINGS_MODULE="autoweb.settings",
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        AUTOWEB_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
        ALLOWED_HOSTS="testserver,127.0.0.1,localhost",
        REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:1/0"),
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    call_command("migrate", verbosity=0)


def seed(n_trials: int, n_releases: int) -> dict:
    from django.apps import apps
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from kernels import problems
    from searches import services
    from searches.models import Trial

    User = get_user_model()
    user = User.objects.create_user("bench", password="pw-page-load-1")
    services.grant_role(user=user, role="engineers")
    reviewer = User.objects.create_user("bench-reviewer", password="pw-page-load-1")
    services.grant_role(user=reviewer, role="reviewers")
    report = json.loads(REPORT.read_text())
    seed_src = problems.load("softmax").seed_path.read_text()
    rng = random.Random(0)
    searches = []
    for title, n in (("big search", n_trials - n_trials // 10), ("small search", n_trials // 10)):
        idea = services.create_idea(
            author=user,
            title=title,
            description="page-load benchmark",
            problem="softmax",
            target_kinds=["h200"],
            proposer="tuner",
            sketch_source="",
            prohibitions="",
            max_trials=n,
            max_gpu_minutes=10_000,
            max_wall_minutes=10_000,
            max_tokens=None,
        )
        search = services.begin_search(search=services.start_search(idea=idea, user=user))
        searches.append((search, n))
    now = timezone.now()
    t0 = time.monotonic()
    for search, n in searches:
        batch = []
        for i in range(1, n + 1):
            src = seed_src + f"\n# variant {search.pk}-{i}\n"
            r = rng.random()
            status = "kept" if r < 0.12 else ("reverted" if r < 0.5 else "failed")
            failed = status == "failed"
            ms = None if failed else rng.uniform(0.01, 0.05)
            batch.append(
                Trial(
                    search=search,
                    index=i,
                    source=src,
                    source_sha256=hashlib.sha256(src.encode()).hexdigest(),
                    proposer="tuner",
                    rationale=f"BLOCK_N={2 ** rng.randint(8, 13)} warps={rng.choice([2, 4, 8])}",
                    knob_values={"BLOCK_N": 1024, "NUM_WARPS": 4},
                    status=status,
                    failure=rng.choice(["incorrect", "compile_error", "timeout"])
                    if failed
                    else None,
                    reasons=["incorrect: max abs error 0.3 at shape M=4097,N=1000"]
                    if failed
                    else [],
                    report=report,
                    device_kind="h200",
                    device_name="NVIDIA H200",
                    versions={"torch": "2.11.0", "triton": "3.6.0"},
                    geomean_ms=ms,
                    speedup_eager=None if failed else rng.uniform(0.8, 3.0),
                    speedup_compiled=None if failed else rng.uniform(0.7, 2.0),
                    noise=None if failed else 0.01,
                    gpu_seconds=2.0,
                    job_id=f"bench-{search.pk}-{i}",
                    attempts=1,
                    created_at=now - timedelta(seconds=n - i),
                    queued_at=now,
                    started_at=now,
                    finished_at=now,
                )
            )
        Trial.objects.bulk_create(batch, batch_size=500)
    insert_s = time.monotonic() - t0
    releases = "library app not installed: no releases, no review pages"
    review_trial = None
    if apps.is_installed("library"):
        releases, review_trial = _releases(n_releases, searches[0][0], reviewer)
    big = searches[0][0]
    return {
        "user": user,
        "reviewer": reviewer,
        "big": big,
        "small": searches[1][0],
        "trial_index": big.trials.filter(status="kept").order_by("-index").first().index,
        "insert_s": round(insert_s, 1),
        "releases": releases,
        "review_trial": review_trial,
    }


def _releases(n: int, search, reviewer) -> tuple[str, int | None]:
    """1,000 approved reviews, re-validations and releases over the big search's kept trials
    (the library app's models as merged; any mismatch is reported, not hidden)."""
    try:
        from library.models import Release, Revalidation, Review

        kept = list(search.trials.filter(status="kept").order_by("index")[:n])
        reviews = Review.objects.bulk_create(
            [Review(trial=t, action="approve", reviewer=reviewer, text="ok") for t in kept]
        )
        revals = Revalidation.objects.bulk_create(
            [
                Revalidation(review=r, kind="h200", status="passed", job_id=f"rv-{r.trial_id}")
                for r in reviews
            ]
        )
        Release.objects.bulk_create(
            [
                Release(
                    problem="softmax",
                    kind="h200",
                    dtype="bfloat16",
                    shape_range={"M": [1, 65536], "N": [1, 65536]},
                    source=t.source,
                    source_sha256=t.source_sha256,
                    trial=t,
                    revalidation=rv,
                    speedup_eager=t.speedup_eager,
                    speedup_compiled=t.speedup_compiled,
                    geomean_ms=t.geomean_ms,
                    shapes=(t.report or {}).get("shapes", []),
                    approver=reviewer,
                )
                for t, rv in zip(kept, revals, strict=True)
            ]
        )
        pending = search.trials.filter(status="kept").exclude(review__isnull=False).first()
        return f"{len(kept)} releases", pending.pk if pending else None
    except Exception as e:  # the library app's schema moved: say so in the results
        return f"release seeding failed: {type(e).__name__}: {e}"[:300], None


def measure(client, url: str, n: int, warm: int = 3) -> dict:
    # Over https, as behind the TLS proxy of a deployment: with DEBUG off the settings redirect
    # plain http (SECURE_SSL_REDIRECT), and a redirect is not the page.
    for _ in range(warm):
        r = client.get(url, secure=True)
        assert r.status_code == 200, (url, r.status_code)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = client.get(url, secure=True)
        times.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200, (url, r.status_code)
    times.sort()
    return {
        "n": n,
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[min(n - 1, int(0.95 * n))], 1),
        "max_ms": round(times[-1], 1),
        "bytes": len(r.content),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--releases", type=int, default=1_000)
    ap.add_argument("--n", type=int, default=50, help="timed requests per page")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="page-load-"))
    db_url = args.database_url or f"sqlite:///{tmp / 'db.sqlite3'}"
    setup(db_url)
    from django.test import Client
    from django.urls import reverse

    world = seed(args.trials, args.releases)
    client = Client()
    client.force_login(world["user"])
    big, small = world["big"], world["small"]
    n_big, n_small = big.trials.count(), small.trials.count()
    pages = {
        "dashboard": reverse("searches:dashboard"),
        f"search ({n_big:,} trials)": reverse("searches:search", args=[big.pk]),
        "search, page 50": reverse("searches:search", args=[big.pk]) + "?page=50",
        f"search ({n_small:,} trials)": reverse("searches:search", args=[small.pk]),
        "trial": reverse("searches:trial", args=[big.pk, world["trial_index"]]),
        # The pages that read the releases besides the releases page (best release per kind
        # and problem in the speedup charts); the dashboard fetches its charts separately.
        "dashboard charts": reverse("searches:dashboard_charts"),
        "GPU page": reverse("searches:gpus"),
        "problem page": reverse("searches:problem", args=["softmax"]),
    }
    results = {name: measure(client, url, args.n) for name, url in pages.items()}
    from django.apps import apps

    if apps.is_installed("library") and not world["releases"].startswith("release seeding"):
        rclient = Client()
        rclient.force_login(world["reviewer"])
        releases = reverse("library:releases")
        lib = {
            "review queue": reverse("library:queue"),
            "releases": releases,
            "releases, page 20": releases + "?page=20",
            "releases, filtered, page 10": releases
            + "?problem=softmax&kind=h200&state=active&page=10",
        }
        if world["review_trial"]:
            lib["review"] = reverse("library:review", args=[world["review_trial"]])
        results.update({name: measure(rclient, url, args.n) for name, url in lib.items()})
    from django.db import connection

    out = {
        "database": connection.vendor,
        "trials": args.trials,
        "releases": world["releases"],
        "insert_s": world["insert_s"],
        "pages": results,
        "loadavg_after": os.getloadavg(),
    }
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
