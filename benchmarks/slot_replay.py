"""Replay a screening run's own timelines through GPU slots: a model, not a measurement.

Each evaluation of a `search_proof.py` run (its JSON's `after.timelines`) is split into the time
before its child first asked for the GPU (loading and compiling) and the time from then to the
end (its GPU stage). The replay feeds them, in order, through `--jobs` GPU slots with `--ahead`
more in flight that compile meanwhile (`evaluate(..., gpu_slots=...)`), and prints evaluations
per minute. An evaluation that never asked for the GPU (a compile that ran out its budget)
holds its place in flight for its whole time and no slot. The model assumes that each stage
takes as long as it did in the run: that compiling more at once does not slow the others on
the host, which only a run on the GPU can tell. With `--ahead 0` it should give back the run's
own figure; if it does not, the model does not describe that run.

    python3 benchmarks/slot_replay.py docs/benchmarks/search/search-2026-12-05-g.json \
        --jobs 12 --ahead 0 2 4 6 [--shorten 0.6] [--give-up-after 20]
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path


def stages(run: dict) -> list[tuple[float, float | None]]:
    """(seconds before the first ask for the GPU, seconds on the GPU or None) per evaluation.
    A run made with slots had each evaluation wait for one after that first ask
    (`gpu_wait.slot_s`): the replay models that wait itself, so it is not part of the stage."""
    waits = run.get("gpu_wait") or [None] * len(run["timelines"])
    out = []
    for tl, seconds, wait in zip(run["timelines"], run["seconds_each"], waits, strict=True):
        if tl and "want_gpu" in tl and "done" in tl:
            slot_s = (wait or {}).get("slot_s") or 0.0
            out.append((tl["want_gpu"], tl["done"] - tl["want_gpu"] - slot_s))
        else:
            out.append((seconds, None))
    return out


def replay(evals: list[tuple[float, float | None]], jobs: int, ahead: int) -> float:
    """Evaluations per minute with `jobs` slots and `jobs + ahead` evaluations in flight."""
    events: list[tuple[float, int, str, float | None]] = []
    nxt, seq, free, queued, finished = 0, 0, jobs, [], []

    def push(at: float, kind: str, gpu: float | None) -> None:
        nonlocal seq
        heapq.heappush(events, (at, seq, kind, gpu))
        seq += 1

    def start(now: float) -> None:
        nonlocal nxt
        if nxt < len(evals):
            compile_s, gpu = evals[nxt]
            nxt += 1
            push(now + compile_s, "compiled", gpu)

    for _ in range(jobs + ahead):
        start(0.0)
    while events:
        now, _, kind, gpu = heapq.heappop(events)
        if kind == "compiled" and gpu is None:  # never reached the GPU
            finished.append(now)
            start(now)
        elif kind == "compiled":
            if free:
                free -= 1
                push(now + gpu, "done", gpu)
            else:
                queued.append(gpu)
        else:
            finished.append(now)
            free += 1
            if queued:
                free -= 1
                push(now + queued.pop(0), "done", None)
            start(now)
    return len(finished) / (max(finished) / 60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a search_proof.py JSON")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--ahead", type=int, nargs="+", default=[0, 4])
    ap.add_argument(
        "--shorten", type=float, default=0.0, help="take this many seconds off every GPU stage"
    )
    ap.add_argument(
        "--give-up-after",
        type=float,
        default=None,
        help="an evaluation that never reached the GPU leaves its place after this many seconds",
    )
    args = ap.parse_args()
    run = json.loads(Path(args.run).read_text())["after"]
    evals = [(c, None if g is None else max(0.0, g - args.shorten)) for c, g in stages(run)]
    if args.give_up_after is not None:
        evals = [(min(c, args.give_up_after) if g is None else c, g) for c, g in evals]
    print(f"measured: {run['per_minute']} evaluations per minute, {run['jobs']} in flight")
    for ahead in args.ahead:
        rate = replay(evals, args.jobs, ahead)
        print(f"replayed: --jobs {args.jobs} --ahead {ahead}: {rate:.1f} per minute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
