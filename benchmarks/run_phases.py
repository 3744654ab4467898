"""Where a screening run's evaluations spent their time, from the JSON `search_proof.py` wrote.

Per step between two phases of the reports' `timeline` (in the order each evaluation reached
them): in how many evaluations it occurred, the median seconds it took and, where the run
recorded the reports' `timeline_cpu`, the median CPU seconds the sandboxed process used in it.
Where the run recorded each shape's samples, how many shapes screening stopped sampling because
the candidate had lost them.
A step that took far more seconds than CPU seconds waited: for the GPU lock, for the GPU
itself, or for a core. Then the run's shares of its wall clock: the GPU held alone to time
(the reports' `gpu_wait.held_exclusive_s`, summed: those holds never overlap) and, where the run
recorded when each evaluation started (`started_at`), how many evaluations were on the GPU at
once on average (from the first ask for the GPU to `gpu_done`) over the steady window (between
the first and the last `jobs` finishing, as `steady_per_minute`), and, over the same window, the
share in which the GPU was held for timing (from `benchmarking` to `gpu_done`) and the share in
which it was not yet but a timing phase had asked for it (its `gpu_wait.exclusive_s` before
`benchmarking`): the GPU then drains, shared holds in progress finishing and new ones waiting.

    python3 benchmarks/run_phases.py docs/benchmarks/search/search-2026-12-05-h100-j8b.json

With `--locks FILE`, the GPU lock's own trace of the same run (`AUTOWEB_GPU_LOCK_TRACE`,
kernels/harness/sandbox.py): how long the holds of each label lasted, and for each timing phase
that had to wait, what it waited for: the hold in progress when it asked that was the last to
end, a child's (`step-NAME`, the step of a shape's work it covered, kernels.harness.childrun
STEPS; `shared` in traces made before the steps were named), a caller's check (`check`) or
another timing phase (`exclusive`);
and over the trace's span, the share of the time the lock was held for timing, by children
and checks together, by either alone, or by nothing (`lock_time`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path


def steps(run: dict) -> list[dict]:
    """One row per step "a -> b" between consecutive phases, in the order first seen."""
    cpus = run.get("cpu_timelines") or [None] * len(run["timelines"])
    rows: dict[str, dict] = {}
    for tl, cpu in zip(run["timelines"], cpus, strict=True):
        if not tl:
            continue
        order = sorted(tl, key=tl.__getitem__)
        for a, b in zip(order, order[1:], strict=False):
            row = rows.setdefault(f"{a} -> {b}", {"wall": [], "cpu": []})
            row["wall"].append(tl[b] - tl[a])
            if cpu and a in cpu and b in cpu:
                row["cpu"].append(cpu[b] - cpu[a])
    return [
        {
            "step": name,
            "n": len(r["wall"]),
            "seconds": round(statistics.median(r["wall"]), 3),
            "cpu_seconds": round(statistics.median(r["cpu"]), 3) if r["cpu"] else None,
        }
        for name, r in rows.items()
    ]


def exclusive_share(run: dict) -> float | None:
    """Share of the run's wall clock in which an evaluation held the GPU alone to time."""
    held = [(w or {}).get("held_exclusive_s") for w in run.get("gpu_wait") or []]
    held = [h for h in held if h is not None]
    wall = (run.get("minutes") or 0) * 60
    return round(sum(held) / wall, 3) if held and wall > 0 else None


def _mean_between(run: dict, first: str, last: str) -> float | None:
    """Mean number of evaluations between the steps `first` and `last` of their timelines,
    over the steady window; None when the run did not record when each started, was too
    short, or no evaluation recorded both steps."""
    started, jobs, done = run.get("started_at"), run.get("jobs") or 0, run.get("done_at")
    if not started or not done or len(done) <= 2 * jobs + 1:
        return None
    done = sorted(done)
    lo, hi = done[jobs - 1], done[-jobs - 1]
    total, seen = 0.0, False
    for t0, tl in zip(started, run["timelines"], strict=True):
        if tl and first in tl and last in tl:
            a, b = max(lo, t0 + tl[first]), min(hi, t0 + tl[last])
            total += max(0.0, b - a)
            seen = True
    return round(total / (hi - lo), 2) if hi > lo and seen else None


def on_gpu(run: dict) -> float | None:
    """Mean number of evaluations between their first ask for the GPU and `gpu_done`, over the
    steady window (`_mean_between`)."""
    return _mean_between(run, "want_gpu", "gpu_done")


def after_gpu(run: dict) -> float | None:
    """Mean number of evaluations still in flight after `gpu_done`, while the caller checked
    their timed outputs, over the steady window (`_mean_between`): places that neither compile
    nor use the GPU."""
    return _mean_between(run, "gpu_done", "timed_verified")


def timed_early(run: dict) -> dict | None:
    """How many of the timed outputs' shapes found their reference computed with the
    verification ones (`gpu_wait.timed_early`), of the shapes timed; None when no report of
    the run counted any (reports made before it was counted, or timing modes the caller did
    not choose)."""
    waits = [w for w in run.get("gpu_wait") or [] if isinstance(w, dict)]
    early = sum(int(w.get("timed_early") or 0) for w in waits)
    if not early:
        return None
    timed = sum(len(ms) for ms in run.get("shape_ms") or [] if ms and ms[0] is not None)
    return {"early": early, "shapes_timed": timed}


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def lock_shares(run: dict) -> dict | None:
    """Over the steady window (as `on_gpu`): the share of the wall clock in which an evaluation
    held the GPU to time, and the share in which none did yet but one waited to (draining).
    None when the run did not record when each evaluation started or was too short."""
    started, jobs, done = run.get("started_at"), run.get("jobs") or 0, run.get("done_at")
    if not started or not done or len(done) <= 2 * jobs + 1:
        return None
    done = sorted(done)
    lo, hi = done[jobs - 1], done[-jobs - 1]
    if hi <= lo:
        return None
    waits = run.get("gpu_wait") or [None] * len(started)
    timing, asked = [], []
    for t0, tl, w in zip(started, run["timelines"], waits, strict=True):
        if not tl or "benchmarking" not in tl or "gpu_done" not in tl:
            continue
        b = t0 + tl["benchmarking"]
        timing.append((b, t0 + tl["gpu_done"]))
        asked.append((b - ((w or {}).get("exclusive_s") or 0.0), b))

    def share(spans: list[tuple[float, float]]) -> float:
        clipped = [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]
        return _union(clipped) / (hi - lo)

    held = share(timing)
    return {"timing": round(held, 3), "draining": round(share(timing + asked) - held, 3)}


def read_locks(text: str) -> list[dict]:
    """The trace's holds: label, shared, asked, got, released. Lines that do not parse (a write
    cut off when the run was stopped) are skipped."""
    holds = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 5 or parts[1] not in ("shared", "exclusive"):
            continue
        try:
            asked, got, released = (float(x) for x in parts[2:])
        except ValueError:
            continue
        holds.append(
            {
                "label": parts[0],
                "shared": parts[1] == "shared",
                "asked": asked,
                "got": got,
                "released": released,
            }
        )
    return holds


def _quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {"n": 0}

    def q(f: float) -> float:
        return round(xs[min(len(xs) - 1, int(f * len(xs)))], 4)

    return {
        "n": len(xs),
        "median": q(0.5),
        "p90": q(0.9),
        "max": round(xs[-1], 4),
        "sum": round(sum(xs), 3),
    }


def lock_waits(holds: list[dict]) -> dict:
    """Per label, how long its holds lasted; and the timing phases' waits, each put down to the
    hold in progress when the phase asked that ended last before the phase got the GPU."""
    by_label: dict[str, list[float]] = {}
    for h in holds:
        by_label.setdefault(h["label"], []).append(h["released"] - h["got"])
    waits: dict[str, list[float]] = {}
    in_progress = []
    for x in (h for h in holds if not h["shared"]):
        before = [
            h
            for h in holds
            if h is not x and h["got"] <= x["asked"] < h["released"] <= x["got"] + 1e-6
        ]
        in_progress.append(sum(1 for h in before if h["shared"]))
        if not before or x["got"] - x["asked"] <= 0:
            continue
        last = max(before, key=lambda h: h["released"])
        waits.setdefault(last["label"], []).append(x["got"] - x["asked"])
    return {
        "held": {k: _quantiles(v) for k, v in sorted(by_label.items())},
        "timing_waited_for": {k: _quantiles(v) for k, v in sorted(waits.items())},
        "shared_in_progress_when_timing_asked": (
            round(sum(in_progress) / len(in_progress), 2) if in_progress else None
        ),
    }


# What held the GPU lock at each moment of the trace: a timing phase, the children's steps and
# the caller's checks together, either alone, or nothing, and then whether a timing phase was
# waiting for the GPU all the same: for a hold the trace does not have, which on a trace of
# this code would be a process that takes the lock without going through `GpuLock`.
LOCK_STATES = (
    "timing",
    "children and checks",
    "children alone",
    "checks alone",
    "nothing traced, timing waiting",
    "free",
)


def lock_time(holds: list[dict]) -> dict | None:
    """The share of the trace's span (first hold taken to last let go) the lock spent in each
    of LOCK_STATES: where the GPU's time went between timing and the shared work. A child's
    hold for its CUDA context (`child-init`) counts with the children's."""
    if not holds:
        return None
    points = []
    for h in holds:
        kind = "timing" if not h["shared"] else "check" if h["label"] == "check" else "child"
        points += [(h["got"], 1, kind), (h["released"], -1, kind)]
        if not h["shared"] and h["got"] > h["asked"]:
            points += [(h["asked"], 1, "waiting"), (h["got"], -1, "waiting")]
    points.sort(key=lambda p: (p[0], p[1]))
    held = {"timing": 0, "child": 0, "check": 0, "waiting": 0}
    spent = dict.fromkeys(LOCK_STATES, 0.0)
    first = min(h["got"] for h in holds)
    last = points[0][0]
    for t, delta, kind in points:
        if held["timing"]:
            state = "timing"
        elif held["child"] and held["check"]:
            state = "children and checks"
        elif held["child"]:
            state = "children alone"
        elif held["check"]:
            state = "checks alone"
        elif held["waiting"]:
            state = "nothing traced, timing waiting"
        else:
            state = "free"
        if t > first:
            spent[state] += t - max(last, first)
        held[kind] += delta
        last = t
    span = points[-1][0] - first
    return {k: round(v / span, 4) for k, v in spent.items()} if span > 0 else None


def lost_shapes(run: dict) -> dict | None:
    """How many shapes the run timed and, of those, how many screening stopped sampling because
    the candidate had lost them (six samples all slower than the faster baseline), with the
    median samples of each kind. None when the run did not record them (`shape_samples`)."""
    samples, lost = run.get("shape_samples"), run.get("shape_lost")
    if not samples or not lost:
        return None
    stopped, tight = [], []
    for ns, ls in zip(samples, lost, strict=True):
        for n, was_lost in zip(ns, ls, strict=True):
            if isinstance(n, int) and n > 0:
                (stopped if was_lost else tight).append(n)
    return {
        "timed": len(stopped) + len(tight),
        "lost": len(stopped),
        "median_samples_lost": statistics.median(stopped) if stopped else None,
        "median_samples_others": statistics.median(tight) if tight else None,
    }


def references(run: dict) -> dict | None:
    """The float64 references of the run's evaluations: how many the compiled oracle computed,
    how many the eager one, and how many evaluations had none compiled; None when the run did
    not record them or the compiled oracle was off (`references`)."""
    rows = [r for r in run.get("references") or [] if isinstance(r, dict)]
    if not rows:
        return None
    return {
        "evaluations": len(rows),
        "compiled": sum(int(r.get("compiled") or 0) for r in rows),
        "eager": sum(int(r.get("eager") or 0) for r in rows),
        "evaluations_all_eager": sum(1 for r in rows if not r.get("compiled")),
    }


def summary(run: dict) -> dict:
    return {
        "evaluations": run.get("evaluations"),
        "stopped": run.get("stopped"),
        "jobs": run.get("jobs"),
        "ahead": run.get("ahead"),
        "stagger_s": run.get("stagger_s"),
        "per_minute": run.get("per_minute"),
        "steady_per_minute": run.get("steady_per_minute"),
        "exclusive_share": exclusive_share(run),
        "on_gpu": on_gpu(run),
        "after_gpu": after_gpu(run),
        "timed_early": timed_early(run),
        "lock": lock_shares(run),
        "steps": steps(run),
        "lost_shapes": lost_shapes(run),
        "references": references(run),
        # Attempts the harness failed on its own part before a verdict (None: a run from
        # before they were counted), and when the first and the `jobs`-th verdicts came: what
        # the pipeline's start cost.
        "faulted_attempts": run.get("faulted_attempts"),
        "first_verdicts": first_verdicts(run),
    }


def first_verdicts(run: dict) -> dict | None:
    done, jobs = run.get("done_at") or [], run.get("jobs") or 0
    if not done or not jobs or len(done) < jobs:
        return None
    return {"first_s": done[0], "jobs_th_s": done[jobs - 1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="search_proof.py JSON files")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    ap.add_argument(
        "--locks",
        type=Path,
        help="the GPU lock's trace of the run (AUTOWEB_GPU_LOCK_TRACE), gzipped if it ends in .gz",
    )
    args = ap.parse_args(argv)
    out = {}
    for path in args.runs:
        try:
            run = json.loads(path.read_text())["after"]
            out[str(path)] = summary(run)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{path}: not a search_proof.py run ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    locks = None
    if args.locks is not None:
        try:
            raw = args.locks.read_bytes()
            if args.locks.suffix == ".gz":
                raw = gzip.decompress(raw)
            holds = read_locks(raw.decode())
            locks = {**lock_waits(holds), "time": lock_time(holds)}
        except (OSError, EOFError, UnicodeDecodeError) as e:
            print(f"{args.locks}: cannot read the lock trace ({e})", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({**out, "locks": locks} if locks else out, indent=1))
        return 0
    for path, s in out.items():
        stopped = f" (stopped by {s['stopped']}: what finished)" if s["stopped"] else ""
        print(
            f"{path}: {s['evaluations']} evaluations{stopped}, jobs {s['jobs']}, "
            f"ahead {s['ahead']}"
            + (f", stagger {s['stagger_s']} s" if s["stagger_s"] else "")
            + f"; {s['per_minute']} per minute, steady state {s['steady_per_minute']}; "
            f"timing alone {s['exclusive_share']} of the wall clock; "
            f"on the GPU at once {s['on_gpu']}, checking the timed outputs after it "
            f"{s['after_gpu']}"
        )
        if s["lock"]:
            print(
                f"  steady window: the GPU held for timing {s['lock']['timing']:.0%} of it, "
                f"draining for a timing phase {s['lock']['draining']:.0%}"
            )
        first = s["first_verdicts"]
        if first:
            print(
                f"  the first verdict at {first['first_s']} s, the first {s['jobs']} by "
                f"{first['jobs_th_s']} s"
            )
        if s["faulted_attempts"] is not None:
            print(f"  attempts the harness failed before a verdict: {s['faulted_attempts']}")
        lost = s["lost_shapes"]
        if lost:
            print(
                f"  shapes timed {lost['timed']}, of which stopped lost {lost['lost']} "
                f"(median samples {_g(lost['median_samples_lost'])}; the others "
                f"{_g(lost['median_samples_others'])})"
            )
        early = s["timed_early"]
        if early:
            print(
                f"  timed outputs' references computed with their verification: "
                f"{early['early']} of {early['shapes_timed']} shapes"
            )
        refs = s["references"]
        if refs:
            print(
                f"  float64 references: {refs['compiled']} compiled, {refs['eager']} eager; "
                f"{refs['evaluations_all_eager']} of {refs['evaluations']} evaluations "
                "had none compiled"
            )
        for row in s["steps"]:
            cpu = "" if row["cpu_seconds"] is None else f"  cpu {row['cpu_seconds']:7.3f} s"
            print(f"  {row['step']:<32} n={row['n']:<4} {row['seconds']:7.3f} s{cpu}")
    if locks:
        print(f"{args.locks}: the GPU lock's holds")
        for label, q in locks["held"].items():
            print(f"  held {label:<10} {_describe(q)}")
        for label, q in locks["timing_waited_for"].items():
            print(f"  a timing phase waited for a {label} hold: {_describe(q)}")
        print(
            "  shared holds in progress when a timing phase asked: "
            f"{locks['shared_in_progress_when_timing_asked']}"
        )
        if locks["time"]:
            shares = ", ".join(f"{k} {v:.0%}" for k, v in locks["time"].items())
            print(f"  the lock over the trace: {shares}")
    return 0


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _describe(q: dict) -> str:
    if not q["n"]:
        return "none"
    return (
        f"n={q['n']}, median {q['median']:.3f} s, p90 {q['p90']:.3f} s, "
        f"max {q['max']:.3f} s, {q['sum']:.1f} s in all"
    )


if __name__ == "__main__":
    sys.exit(main())
