"""Replay a screening run's own timelines through GPU slots: a model, not a measurement.

Each evaluation of a `search_proof.py` run (its JSON's `after.timelines`) is split into the time
before its child first asked for the GPU (loading and compiling) and the time from then to the
end (its GPU stage). The replay feeds them, in order, through `--jobs` GPU slots with `--ahead`
more in flight that compile meanwhile (`evaluate(..., gpu_slots=...)`), and prints evaluations
per minute. An evaluation that never asked for the GPU (a compile that ran out its budget)
holds no slot, and holds its place in flight for its whole time unless `--linger` lets it give
the place to the next (at most max(1, `--ahead`) at a time, as `kernels tune --linger`). The
model assumes that each stage takes as long as it did in the run: that compiling more at once
does not slow the others on the host, which only a run on the GPU can tell. With `--ahead 0`
it should give back the run's own figure; if it does not, the model does not describe that
run.

    python3 benchmarks/slot_replay.py docs/benchmarks/search/search-2026-12-05-g.json \
        --jobs 12 --ahead 0 2 4 6 [--shorten 0.6] [--linger 20]
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.engine.flight import spare_for  # noqa: E402


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


def replay(
    evals: list[tuple[float, float | None]],
    jobs: int,
    ahead: int,
    linger: float | None = None,
    spare: int = 0,
) -> float:
    """Evaluations per minute with `jobs` slots and `jobs + ahead` places in flight. With
    `linger`, an evaluation still compiling that long after it started gives its place to the
    next, at most `spare` at a time (the oldest first), as kernels.engine.flight does."""
    events: list[tuple[float, int, str, int]] = []
    seq, nxt, free, holding = 0, 0, jobs, 0
    queued: list[int] = []  # compiled, waiting for a slot
    lingering: set[int] = set()
    overdue: list[int] = []  # past `linger` but no spare was left, oldest first
    finished: list[float] = []
    places = jobs + ahead

    def push(at: float, kind: str, i: int) -> None:
        nonlocal seq
        heapq.heappush(events, (at, seq, kind, i))
        seq += 1

    def fill(now: float) -> None:
        nonlocal nxt, holding
        while holding < places and nxt < len(evals):
            compile_s, _ = evals[nxt]
            holding += 1
            push(now + compile_s, "compiled", nxt)
            if linger is not None and spare and compile_s > linger:
                push(now + linger, "linger", nxt)
            nxt += 1

    def give_up(i: int) -> None:
        nonlocal holding
        lingering.add(i)
        holding -= 1

    def end(i: int, now: float) -> None:
        nonlocal holding
        finished.append(now)
        if i in lingering:
            lingering.discard(i)
            if overdue:  # the spare comes back: the oldest overdue one takes it
                give_up(overdue.pop(0))
        else:
            holding -= 1
        fill(now)

    fill(0.0)
    done_compiling: set[int] = set()
    while events:
        now, _, kind, i = heapq.heappop(events)
        gpu = evals[i][1]
        if kind == "linger":
            if i not in done_compiling:
                if len(lingering) < spare:
                    give_up(i)
                    fill(now)
                else:
                    overdue.append(i)
        elif kind == "compiled":
            done_compiling.add(i)
            if i in overdue:
                overdue.remove(i)
            if gpu is None:  # never reached the GPU
                end(i, now)
            elif free:
                free -= 1
                push(now + gpu, "done", i)
            else:
                queued.append(i)
        else:
            free += 1
            if queued:
                free -= 1
                j = queued.pop(0)
                push(now + evals[j][1], "done", j)
            end(i, now)
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
        "--linger",
        type=float,
        default=None,
        help="an evaluation still compiling after this many seconds gives its place in flight "
        "to the next, at most max(1, --ahead) at a time (kernels tune --linger)",
    )
    args = ap.parse_args()
    run = json.loads(Path(args.run).read_text())["after"]
    evals = [(c, None if g is None else max(0.0, g - args.shorten)) for c, g in stages(run)]
    print(f"measured: {run['per_minute']} evaluations per minute, {run['jobs']} in flight")
    for ahead in args.ahead:
        spare = spare_for(ahead, args.linger)
        rate = replay(evals, args.jobs, ahead, linger=args.linger, spare=spare)
        with_linger = f" --linger {args.linger:g}" if args.linger else ""
        print(f"replayed: --jobs {args.jobs} --ahead {ahead}{with_linger}: {rate:.1f} per minute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
