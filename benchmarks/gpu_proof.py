"""GPU proof for the harness: ceilings, seed vs tuned kernels on the full sweep, planted
exploits on CUDA, and the harness's throughput. Writes one JSON file; docs/benchmarks/
holds the tables made from it (benchmarks/render.py).

    python benchmarks/gpu_proof.py --out results.json --problems softmax,rmsnorm --trials 12
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels import knobs, problems  # noqa: E402
from kernels.engine.tuner import Tuner  # noqa: E402
from kernels.harness import device as devmod  # noqa: E402
from kernels.harness import evaluate, retime  # noqa: E402
from kernels.harness.sandbox import Pool  # noqa: E402

_print_lock = threading.Lock()
HONEST_FULL = True
TUNE_FROM_HONEST = False


def log(*a) -> None:
    with _print_lock:
        print(time.strftime("%H:%M:%S"), *a, flush=True)


def tune_shapes(problem) -> list[dict]:
    """A few shapes of the full sweep for tuning trials: the two largest, a middle, a small."""
    full = problem.shapes("full")
    dt = problem.dtype("cuda")
    by_size = sorted(full, key=lambda s: problem.bytes(s, dt) + problem.flops(s) / 200)
    pick = [by_size[-1], by_size[-2], by_size[len(by_size) // 2], by_size[1]]
    out = []
    for s in pick:
        if s not in out:
            out.append(s)
    return out


def slim(rep: dict) -> dict:
    """The report without bulky per-output error dicts (kept: first-call errors)."""
    rep = json.loads(json.dumps(rep, default=str))
    for s in rep.get("shapes", []):
        errs = s.get("errors", {})
        s["errors"] = {
            k: {
                kk: v.get(kk)
                for kk in ("passed", "max_abs_err", "rel_l2_err", "mismatched", "reason")
            }
            for k, v in errs.items()
        }
    return rep


def run_problem(name: str, trials: int, budget: float, pool: Pool, res: dict) -> dict:
    p = problems.load(name)
    seed_src = p.seed_path.read_text()
    res.update(problem=name, tune_shapes=[problems.shape_label(s) for s in tune_shapes(p)])
    t0 = time.time()
    rep = evaluate(p, seed_src, device="cuda", tier="full", budget_s=budget)
    res["seed"] = slim(rep)
    log(
        name,
        "seed full:",
        rep["verdict"],
        rep["failure"],
        rep["summary"].get("geomean_speedup_eager"),
        f"{time.time() - t0:.0f}s",
        rep["reasons"][:2],
    )
    honest = ROOT / "tests" / "fixtures" / "honest" / f"{name}_tuned.py"
    if honest.exists() and HONEST_FULL:
        t0 = time.time()
        rep = evaluate(p, honest.read_text(), device="cuda", tier="full", budget_s=budget)
        res["honest_tuned"] = slim(rep)
        res["honest_tuned_source"] = honest.read_text()
        log(
            name,
            "honest tuned full:",
            rep["verdict"],
            rep["failure"],
            rep["summary"].get("geomean_speedup_eager"),
            f"{time.time() - t0:.0f}s",
            rep["reasons"][:2],
        )
    if trials:
        shapes = tune_shapes(p)
        starts = [honest.read_text() if honest.exists() and TUNE_FROM_HONEST else seed_src]
        res["tune_start"] = "honest_tuned" if starts[0] != seed_src else "seed"
        t0 = time.time()

        def ev(src: str) -> dict:
            return evaluate(
                p,
                src,
                device="cuda",
                shapes=shapes,
                tier="tune",
                budget_s=0.15,
                baselines_compiled=False,
                pool=pool,
            )

        def rt(srcs: list[str]) -> list[dict]:
            return retime(
                p, srcs, device="cuda", shapes=shapes, tier="tune", budget_s=0.25, pool=pool
            )

        tuner = Tuner(
            starts[0],
            trials=trials,
            evaluate=ev,
            retime=rt,
            seed=0,
            on_trial=lambda r: log(name, f"[{r['index']}]", r["description"]),
        )
        tr = tuner.run()
        res["tune"] = {k: v for k, v in tr.to_dict().items() if k != "best_report"}
        res["tune"]["seconds"] = time.time() - t0
        log(name, "tuned:", tr.best_values, f"{tr.evals_per_minute} evals/min")
        if tr.best_source != seed_src:
            t0 = time.time()
            rep = evaluate(p, tr.best_source, device="cuda", tier="full", budget_s=budget)
            res["best"] = slim(rep)
            log(
                name,
                "best full:",
                rep["verdict"],
                rep["summary"].get("geomean_speedup_eager"),
                f"{time.time() - t0:.0f}s",
            )
    return res


def run_exploits(pool: Pool) -> list[dict]:
    out = []
    files = sorted((ROOT / "tests" / "fixtures" / "exploits").glob("*.py"))
    jobs = []
    for f in files:
        head = f.read_text()
        expect = re.search(r"^# expect: (\w+)", head, re.M).group(1)
        prob = re.search(r"^# problem: (\w+)", head, re.M).group(1)
        jobs.append((f, prob, expect, False))
    for name in ("monkeypatch_torch", "monkeypatch_timer", "side_stream", "library_fallback_arith"):
        f = ROOT / "tests" / "fixtures" / "exploits" / f"{name}.py"
        jobs.append((f, "softmax", None, True))

    def one(job):
        f, prob, expect, skip = job
        kw = {"timeout_s": 30} if f.stem == "hang" else {}
        if f.stem == "oom":
            kw["memory_bytes"] = 8 << 30
        t0 = time.time()
        try:
            rep = evaluate(
                prob,
                f.read_text(),
                device="cuda",
                tier="smoke",
                budget_s=0.1,
                skip_static_checks=skip,
                **kw,
            )
            r = {
                "fixture": f.stem,
                "static_checks": not skip,
                "expect": expect,
                "verdict": rep["verdict"],
                "failure": rep["failure"],
                "reasons": rep["reasons"][:3],
                "seconds": round(time.time() - t0, 1),
            }
        except Exception as e:
            r = {
                "fixture": f.stem,
                "static_checks": not skip,
                "expect": expect,
                "error": traceback.format_exc()[-800:],
                "exc": repr(e),
            }
        log(
            "exploit",
            r["fixture"],
            "static" if not skip else "runtime-only",
            r.get("failure"),
            "expect",
            expect,
            (r.get("reasons") or [""])[0][:150],
        )
        return r

    with ThreadPoolExecutor(4) as ex:
        out = list(ex.map(one, jobs))
    # The GPU stays usable after a crash / illegal memory access in a candidate:
    rep = evaluate(
        "softmax",
        (ROOT / "kernels/seeds/softmax.py").read_text(),
        device="cuda",
        tier="smoke",
        budget_s=0.1,
    )
    out.append(
        {"fixture": "seed_after_exploits", "verdict": rep["verdict"], "failure": rep["failure"]}
    )
    return out


def throughput(n: int, jobs: int) -> dict:
    """Evaluations per GPU-minute on the smoke tier: softmax knob configs, `jobs` in flight."""
    p = problems.load("softmax")
    src = p.seed_path.read_text()
    ks = knobs.parse_knobs(src)
    import itertools

    configs = [
        dict(zip([k.name for k in ks], vals, strict=True))
        for vals in itertools.product(*[k.choices for k in ks])
    ][:n]
    sources = [knobs.rewrite(src, c) for c in configs]
    pool = Pool("cuda", size=jobs)
    try:
        time.sleep(8)  # let the pool warm up, as a long-running worker's would be
        t0 = time.time()
        with ThreadPoolExecutor(jobs) as ex:
            reps = list(
                ex.map(
                    lambda s: evaluate(
                        p,
                        s,
                        device="cuda",
                        tier="smoke",
                        budget_s=0.1,
                        pool=pool,
                        baselines_compiled=False,
                    ),
                    sources,
                )
            )
        wall = time.time() - t0
    finally:
        pool.close()
    tl = [r.get("timeline", {}) for r in reps]
    return {
        "evaluations": len(reps),
        "jobs": jobs,
        "wall_s": wall,
        "timelines": tl[:8],
        "baselines": "eager only (tuner trials); torch.compile baseline in final reports",
        "evals_per_gpu_minute": len(reps) / (wall / 60),
        "accepted": sum(r["verdict"] == "accepted" for r in reps),
        "failures": [r["failure"] for r in reps if r["failure"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--problems", default="")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--exploits", action="store_true")
    ap.add_argument("--throughput", type=int, default=0)
    ap.add_argument("--throughput-jobs", type=int, default=4, help="evaluations in flight")
    ap.add_argument("--no-honest-full", action="store_true")
    ap.add_argument("--tune-from-honest", action="store_true")
    args = ap.parse_args()
    global HONEST_FULL, TUNE_FROM_HONEST
    HONEST_FULL = not args.no_honest_full
    TUNE_FROM_HONEST = args.tune_from_honest
    out: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": sys.argv}
    out["device"] = devmod.info("cuda")
    out["ceilings"] = devmod.ceilings(measure=True)
    log("device", out["device"]["name"], out["ceilings"])
    path = Path(args.out)

    def save() -> None:
        path.write_text(json.dumps(out, indent=1, default=str))

    save()
    if args.exploits:
        out["exploits"] = run_exploits(None)
        save()
    if args.throughput:
        out["throughput"] = throughput(args.throughput, jobs=args.throughput_jobs)
        log("throughput", out["throughput"])
        save()
    names = [n for n in args.problems.split(",") if n]
    if names:
        pool = Pool("cuda", size=args.parallel)
        out["problems"] = {}
        try:
            with ThreadPoolExecutor(args.parallel) as ex:
                futs = {}
                for n in names:
                    out["problems"][n] = {}
                    futs[n] = ex.submit(
                        run_problem, n, args.trials, args.budget, pool, out["problems"][n]
                    )
                pending = set(futs)
                while pending:
                    time.sleep(5)
                    save()  # partial results survive a run cut short
                    for n in list(pending):
                        if futs[n].done():
                            pending.discard(n)
                            try:
                                futs[n].result()
                            except Exception:
                                out["problems"][n]["error"] = traceback.format_exc()[-2000:]
                                log(n, "ERROR", traceback.format_exc()[-1500:])
                save()
        finally:
            pool.close()
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    save()


if __name__ == "__main__":
    main()
