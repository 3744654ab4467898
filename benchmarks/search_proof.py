"""The search engine on a GPU, measured: screening throughput before and after the baseline
cache, then a whole tune of a user's problem from its naive seed, ending with the per-shape
table. Writes one JSON file and prints the figures docs/benchmarks/search.md records.

    python3 benchmarks/search_proof.py --out search.json \
        --problems-dir benchmarks/user_problems --problem token_logprobs \
        --before 8 --throughput 48 --jobs 12 --trials 120 --tune-minutes 5

Phases (each on the full sweep):
1. `cold`: the baseline cache for the problem measured in a clean sandbox (once per GPU,
   problem and versions; what a first search pays), or with `--reuse-baselines` taken from
   an earlier run's cache on this host (each screening's drift canary still checks it);
2. `before`: `--before` evaluations of distinct knob configurations the old way (both
   baselines compiled and timed with every candidate, a fixed 0.5 s of timing per shape);
3. `after`: `--throughput` screening evaluations of distinct configurations (cached baselines,
   adaptive timing, `--jobs` on the GPU and `--ahead` more loading and compiling meanwhile, a
   compile past `--linger` seconds giving its place to the next, the first `--jobs` let onto
   the GPU one every `--stagger` seconds, `--pool-idle` warm sandboxes kept idle);
4. `tune`: the tuner from the seed (`--trials`, at most `--tune-minutes` of proposing), its
   wins confirmed by interleaved re-times, then its best candidates and both baselines timed
   together for the per-shape table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels import problems  # noqa: E402
from kernels.engine.flight import (  # noqa: E402
    Flight,
    Stagger,
    seconds_or_off,
    spare_for,
    warm_pool,
)
from kernels.engine.proposers import KnobProposer, Tried  # noqa: E402
from kernels.engine.tuner import Tuner  # noqa: E402
from kernels.harness import (  # noqa: E402
    BaselineCache,
    evaluate,
    measure_baselines,  # noqa: E402
    retime,
    time_together,
)
from kernels.harness import baselines as bl  # noqa: E402
from kernels.harness import device as devmod  # noqa: E402
from kernels.harness.sandbox import Pool, adopt_escaped_processes, kill_all  # noqa: E402
from kernels.protocol import FAULT_ATTEMPTS, HarnessFault, again_on_fault  # noqa: E402

_lock = threading.Lock()


class Stopped(BaseException):
    """SIGTERM (`timeout`'s signal) reached the main thread: the screening phase keeps what
    finished, the JSON is written, and the script exits with 124."""


def _stop(signum, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


def log(*a) -> None:
    with _lock:
        print(time.strftime("%H:%M:%S"), *a, flush=True)


def configs(source: str, n: int) -> list[str]:
    """n distinct knob variants of the source, in the proposer's space-filling order."""
    proposer = KnobProposer(source, seed=0)
    tried: list[Tried] = []
    out = []
    while len(out) < n:
        p = proposer.next(tried)
        if p is None:
            break
        out.append(p.source)
        tried.append(Tried(p.knob_values, None, False))
    return out


class HostLoad:
    """The host's CPU use, sampled once a second while a phase runs: whether the evaluations in
    flight wait for the cores (sandboxed children, compiles, this process) or for the GPU. This
    process's own use is sampled apart (in percent of one core): it reads every child's messages
    and outputs and computes their references, under one interpreter lock."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.own: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        psutil.cpu_percent(None)
        me.cpu_percent(None)
        while not self._stop.wait(1.0):
            self.samples.append(psutil.cpu_percent(None))
            self.own.append(me.cpu_percent(None))

    def __enter__(self) -> HostLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        import psutil

        xs, own = sorted(self.samples), sorted(self.own)
        return {
            "cores": psutil.cpu_count(),
            "samples": len(xs),
            "median_percent": xs[len(xs) // 2] if xs else None,
            "max_percent": xs[-1] if xs else None,
            "caller_median_percent_of_a_core": own[len(own) // 2] if own else None,
            "caller_max_percent_of_a_core": own[-1] if own else None,
        }


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return round(xs[len(xs) // 2], 3) if xs else None


def rate(sources: list[str], jobs: int, ev, ahead: int = 0, linger: float = 0.0) -> dict:
    """Evaluate the sources with `jobs` + `ahead` in flight (`ev(source, on_event)` bounds those
    on the GPU), a compile past `linger` seconds giving its place to the next, at most
    max(1, `ahead`) at a time (kernels.engine.flight, as `kernels tune` does); evaluations per
    minute of wall clock, over the whole run and in the steady state (between the first and
    the last `jobs` finishing, where the pipeline is full)."""
    finished: list[tuple[float, float, dict | None, int]] = []  # in the order they finish
    not_judged: list[str] = []  # HarnessFault each time: why
    t0 = time.perf_counter()
    spare = spare_for(ahead, linger)
    flight = Flight(jobs + ahead, linger_s=linger or None, spare=spare)

    def one(k: int, src: str, ticket) -> tuple[float, float, dict | None, int]:
        started = time.perf_counter() - t0
        fault = None
        attempts: list[float] = []  # when each attempt began
        faults: list[str] = []

        def attempt() -> dict:
            attempts.append(round(time.perf_counter() - t0, 3))
            try:
                return ev(src, ticket.on_event)
            except HarnessFault as e:
                at = time.perf_counter() - t0
                log(f"[fault] {at:7.1f} s attempt {len(attempts)} not judged: {str(e)[:200]}")
                raise

        try:
            # The harness failing on its own part is tried again, as `kernels tune` does; still
            # failing, the configuration was not judged: no verdict, not counted as one. The
            # attempts before a verdict are logged and counted: their time is in the rate.
            report = again_on_fault(attempt, faults)
            report["harness_faults"] = faults
            report["attempts_at"] = attempts
        except HarnessFault as e:
            report, fault = None, str(e)
        finally:
            ticket.end()
        done = time.perf_counter() - t0
        with _lock:
            finished.append((started, done, report, k))
            if fault is not None:
                not_judged.append(fault[:300])
            n = len(finished)
        # A run stopped early still says how far it got, in its log as in its JSON.
        verdict = report["verdict"] if report else "not judged"
        log(f"[{n:3d}/{len(sources)}] {done:7.1f} s {verdict}")
        return started, done, report, k

    stopped = None
    pool = ThreadPoolExecutor(jobs + ahead + spare)
    futures = []
    try:
        with HostLoad() as load:
            try:
                for k, src in enumerate(sources):
                    flight.wait_for_place()
                    futures.append(pool.submit(one, k, src, flight.begin()))
                results = [f.result() for f in futures]
            except Stopped as e:
                # What finished counts; what was in flight is dropped, not waited for.
                stopped = str(e)
                with _lock:
                    results = list(finished)
    finally:
        pool.shutdown(wait=stopped is None, cancel_futures=stopped is not None)
    results = [r for r in results if r[2] is not None]  # verdicts only
    started_at = [started for started, _, _, _ in results]
    reports = [report for _, _, report, _ in results]
    minutes = (time.perf_counter() - t0) / 60
    done_at = sorted(done for _, done, _, _ in results)
    steady = None
    if len(done_at) > 2 * jobs + 1:
        a, b = done_at[jobs - 1], done_at[-jobs - 1]
        steady = round((len(done_at) - 2 * jobs) / ((b - a) / 60), 1) if b > a else None
    seconds = [r["summary"].get("seconds") for r in reports]
    return {
        "evaluations": len(reports),
        # Set when a signal stopped the phase: the figures are of the evaluations finished by
        # then, over the time until then, and the rest of `sources` never finished.
        "stopped": stopped,
        # Evaluations that reached no verdict (the harness failed each time), apart from
        # `evaluations` and the rates, which count verdicts over the whole wall clock.
        "not_judged": not_judged,
        # Attempts that ended in HarnessFault before a verdict, in all and per report (in the
        # order of the lists below), and when each report's attempts began.
        "faulted_attempts": sum(len(r["harness_faults"]) for r in reports)
        + len(not_judged) * FAULT_ATTEMPTS,
        "harness_faults": [r["harness_faults"] for r in reports],
        "attempts_at": [r["attempts_at"] for r in reports],
        "jobs": jobs,
        "ahead": ahead,
        "linger_s": linger or None,
        "lingered": flight.gave_up,
        "minutes": round(minutes, 3),
        "per_minute": round(len(reports) / minutes, 1) if minutes else None,
        "steady_per_minute": steady,
        "done_at": [round(x, 2) for x in done_at],
        # Seconds from the start to each evaluation's call, in the order of the lists below
        # (`done_at` is sorted): with `timelines`, when each phase of each ran.
        "started_at": [round(x, 3) for x in started_at],
        "accepted": sum(1 for r in reports if r["verdict"] == "accepted"),
        "failures": sorted({r["failure"] for r in reports if r["failure"]}),
        "seconds_each": seconds,
        "timelines": [r.get("timeline") for r in reports],
        "cpu_timelines": [r.get("timeline_cpu") for r in reports],
        "gpu_wait": [r.get("gpu_wait") for r in reports],
        "median_gpu_wait": {
            k: _median([(r.get("gpu_wait") or {}).get(k) for r in reports])
            for k in (
                *("shared_s", "exclusive_s", "check_s", "holds", "slot_s", "reference_s"),
                *("held_shared_s", "held_exclusive_s", "held_shared_max_s"),
                *("held_check_s", "held_check_max_s", "references_ahead", "ahead_s"),
            )
        },
        "host_cpu": load.summary(),
        # Which of `sources` each report judged (the lists here follow the finishing order
        # when a signal stopped the run), and per shape the candidate's median, samples, and
        # whether screening stopped sampling a shape it had lost (`candidate_slower_than_ms`).
        "source_index": [k for _, _, _, k in results],
        "shape_ms": [[sh.get("candidate_ms") for sh in r.get("shapes", [])] for r in reports],
        "shape_samples": [
            [sh.get("candidate_samples") for sh in r.get("shapes", [])] for r in reports
        ],
        "shape_lost": [
            [sh.get("candidate_slower_than_ms") is not None for sh in r.get("shapes", [])]
            for r in reports
        ],
        # How many of each evaluation's float64 references the compiled oracle computed and how
        # many the eager one (None where the compiled oracle was off: docs/harness.md).
        "references": [r.get("references") for r in reports],
        "reasons": [r["reasons"][:2] for r in reports],
        "baselines": [
            {k: (r.get("baselines") or {}).get(k) for k in ("source", "canary")} for r in reports
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--problems-dir", action="append", default=[])
    ap.add_argument("--problem", default="token_logprobs")
    ap.add_argument("--before", type=int, default=8)
    ap.add_argument("--throughput", type=int, default=48)
    ap.add_argument("--jobs", type=int, default=12, help="evaluations on the GPU at once")
    ap.add_argument(
        "--ahead",
        type=int,
        default=4,
        help="evaluations beyond --jobs loading and compiling meanwhile (the screening phase)",
    )
    ap.add_argument(
        "--linger",
        type=float,
        default=20.0,
        help="a candidate still compiling after this many seconds gives its place in flight to "
        "the next, at most max(1, --ahead) at a time (0: never)",
    )
    ap.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="the screening's first --jobs evaluations take their GPU slots one every this "
        "many seconds rather than all at once (0: all at once)",
    )
    ap.add_argument(
        "--pool-idle",
        type=int,
        default=None,
        help="warm sandboxes kept idle once the first evaluations have taken theirs (each "
        "holds a CUDA context); by default as `kernels tune` keeps them, --ahead and 2 more",
    )
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--tune-minutes", type=float, default=5.0)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument(
        "--reuse-baselines",
        action="store_true",
        help="take the baselines from an earlier run's cache on this host when it holds them "
        "(same GPU, problem, shapes and versions) instead of measuring them first",
    )
    ap.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "interpret"],
        help="interpret: a smoke run of this script on the CPU (smoke shapes, nothing timed)",
    )
    args = ap.parse_args()
    if not seconds_or_off(args.linger):
        ap.error("--linger is a number of seconds above 0, or 0 to turn it off")
    if not seconds_or_off(args.stagger):
        ap.error("--stagger is a number of seconds above 0, or 0 to turn it off")
    if args.pool_idle is not None and args.pool_idle < 1:
        ap.error("--pool-idle is a whole number of warm sandboxes, at least 1")
    gpu = args.device == "cuda"
    if args.problems_dir:
        os.environ["AUTOWEB_PROBLEM_DIRS"] = os.pathsep.join(
            str(Path(d).resolve()) for d in args.problems_dir
        )
    adopt_escaped_processes()
    signal.signal(signal.SIGTERM, _stop)
    out: dict = {"args": vars(args), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    problem = problems.load(args.problem)
    out["device"] = devmod.info(args.device)
    log("device", out["device"]["name"], out["device"]["ceilings"])
    seed = problem.seed_path.read_text()
    tier = "full" if gpu else "smoke"
    shapes = problem.shapes(tier)
    # Warm sandboxes, so that an evaluation does not wait for Python, torch and CUDA to start:
    # as `kernels tune` keeps them (kernels.engine.flight.warm_pool), as many as begin at once
    # and one more start first, then a few are kept idle, each taken replaced in the
    # background; `--pool-idle` sets how many.
    spare = spare_for(args.ahead, args.linger)
    first, idle = warm_pool(args.jobs, args.ahead, spare)
    pool = Pool(args.device, size=args.pool_idle or idle, first=first)
    out["pool"] = {"first": pool.first, "idle": pool.size}
    cache = (
        BaselineCache(Path(os.environ.get("TMPDIR", "/tmp")) / "autoweb-search-proof")
        if gpu
        else None
    )
    common = dict(device=args.device, tier=tier, pool=pool, budget_s=args.budget)

    def save() -> None:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))

    try:
        # 1. the baselines, measured once (a clean sandbox, no candidate)
        dtype = str(problem.dtype(args.device)).replace("torch.", "")
        fields = bl.key_fields(problem, devmod.info(args.device), dtype)
        labels = [problems.shape_label(s) for s in shapes]
        if gpu and args.reuse_baselines and cache.get(fields, labels) is not None:
            out["cold"] = {"reused": True, "entries": cache.get(fields, labels)}
            log("baselines reused from the cache of an earlier run on this host")
        elif gpu:
            t0 = time.perf_counter()
            entries = measure_baselines(problem, shapes, device="cuda", pool=pool)
            cache.put(fields, labels, entries)
            out["cold"] = {"seconds": round(time.perf_counter() - t0, 1), "entries": entries}
            log(f"baselines measured in {out['cold']['seconds']} s")
            save()

        variants = configs(seed, args.before + args.throughput)
        # 2. before: the old way, every candidate compiles and times both baselines
        if args.before:
            out["before"] = rate(
                variants[: args.before],
                min(args.jobs, args.before),
                lambda s, on_event: evaluate(problem, s, on_event=on_event, **common),
            )
            log("before:", out["before"]["per_minute"], "evaluations per minute")
            save()
        # 3. after: screening with the cache
        if args.throughput:
            slots = (
                threading.Semaphore(args.jobs)
                if args.ahead or args.linger or args.stagger
                else None
            )
            if args.stagger:
                slots = Stagger(slots, args.jobs, args.stagger)
            out["after"] = rate(
                variants[args.before :],
                args.jobs,
                lambda s, on_event: evaluate(
                    problem, s, baselines=cache, gpu_slots=slots, on_event=on_event, **common
                ),
                ahead=args.ahead,
                linger=args.linger,
            )
            out["after"]["stagger_s"] = args.stagger or None
            log(
                "after:",
                out["after"]["per_minute"],
                "evaluations per minute; steady state",
                out["after"]["steady_per_minute"],
            )
            log("median wait for the GPU lock:", out["after"]["median_gpu_wait"])
            log("host CPU:", out["after"]["host_cpu"])
            save()
            if out["after"]["stopped"]:
                raise Stopped(out["after"]["stopped"])
        # 4. the tune from the seed
        if args.trials:
            t0 = time.perf_counter()
            tslots = threading.Semaphore(args.jobs) if args.ahead or args.linger else None
            tuner = Tuner(
                seed,
                trials=args.trials,
                evaluate=lambda s, on_event=None: evaluate(
                    problem, s, baselines=cache, gpu_slots=tslots, on_event=on_event, **common
                ),
                retime=(lambda srcs: retime(problem, srcs, baselines=cache, **common))
                if gpu
                else None,
                together=(lambda srcs: time_together(problem, srcs, baselines=cache, **common))
                if gpu
                else None,
                jobs=args.jobs + args.ahead,
                max_minutes=args.tune_minutes,
                linger_s=args.linger or None,
                spare=spare,
                on_trial=lambda r: log(f"[{r['index']:3d}]", r["description"]),
            )
            log("strategy:", tuner.strategy, "-", tuner.proposer.why)
            result = tuner.run()
            tune = result.to_dict()
            tune.pop("best_report", None)
            tune["best_summary"] = (result.best_report or {}).get("summary")
            tune["wall_minutes"] = round((time.perf_counter() - t0) / 60, 3)
            out["tune"] = tune
            save()
            table = result.table or {}
            if table.get("shapes"):
                from kernels.cli import print_table

                print_table(table)
            best = (table or {}).get("best_single") or {}
            log("evaluations per GPU-minute:", out.get("after", {}).get("per_minute"))
            log("per-shape geomean vs torch.compile:", table.get("geomean_speedup_compiled"))
            log(
                "shapes at or above torch.compile:",
                f"{table.get('shapes_at_or_above_compiled')}/{table.get('shapes_with_compiled')}",
            )
            log("best single kernel vs torch.compile:", best.get("geomean_speedup_compiled"))
    except Stopped as e:
        out["stopped"] = str(e)
        log(f"stopped by {e}: the JSON holds what finished")
        kill_all()  # the evaluations still in flight end now, not at their own pace
        return 124
    finally:
        pool.close()
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
