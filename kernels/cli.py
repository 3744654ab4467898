"""`python -m kernels`: problems, evaluate, tune, ceilings, profile, new-problem.

Exit codes: 0 accepted (or success), 1 rejected, 2 usage error, 143 stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path

from kernels import problems
from kernels.harness.static import MAX_SOURCE_BYTES
from kernels.protocol import HarnessFault, again_on_fault, source_sha256


class UsageError(Exception):
    pass


# No accepted configuration of the screening runs in docs/benchmarks/search.md compiled for
# over 14.2 s: one still compiling at 20 s is most likely one the 60 s compile budget stops.
DEFAULT_LINGER_S = 20.0
DEFAULT_STAGGER_S = 0.0
MAX_JOBS = 256  # evaluations in flight in one tune: each is a sandboxed process with torch


def _fmt(x, spec: str = ".3f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def _write_json(path: str | None, obj) -> None:
    if path:
        Path(path).write_text(json.dumps(obj, indent=2, default=str) + "\n")


def _with_source(rep: dict, source: str) -> dict:
    """The report as `--json` writes it: with the source it judged and that source's sha256,
    so that another host can import it (`manage.py import_reports`) and check what it holds."""
    return {**rep, "source": source, "source_sha256": source_sha256(source)}


def _load_problem(args) -> problems.Problem:
    try:
        return problems.load(args.problem, args.problems_dir)
    except problems.ProblemError as e:
        raise UsageError(str(e)) from e


def _read_candidate(path: str | None, problem: problems.Problem) -> tuple[str, str]:
    p = Path(path) if path else problem.seed_path
    if not p.is_file():
        raise UsageError(f"candidate file {str(p)!r} does not exist")
    try:
        if p.stat().st_size > MAX_SOURCE_BYTES:
            # Enough for the static check to reject it as oversize, without reading it all.
            with p.open("rb") as f:
                return f.read(MAX_SOURCE_BYTES + 1).decode("utf-8", "replace"), str(p)
        return p.read_text(), str(p)
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read candidate {str(p)!r}: {e}") from e


def _device(arg: str) -> str:
    from kernels.harness import device

    try:
        return device.resolve(arg)
    except ValueError as e:
        raise UsageError(str(e)) from e


def cmd_problems(args) -> int:
    probs, errors = problems.load_all(args.problems_dir)
    for why in errors:
        print(f"error: {why}", file=sys.stderr)
    if args.json:
        _write_json(args.json, [p.to_dict() for p in probs])
    for p in probs:
        d = p.to_dict()
        print(
            f"{p.name:18s} {p.signature:28s} dtypes: "
            + ", ".join(f"{k}={v}" for k, v in d["dtypes"].items())
        )
        if p.description:
            print(f"  {p.description}")
        print(f"  smoke ({len(d['shapes']['smoke'])}): " + "; ".join(d["shapes"]["smoke"]))
        print(f"  full  ({len(d['shapes']['full'])}): " + "; ".join(d["shapes"]["full"]))
    return 1 if errors else 0


def print_report(rep: dict, out=sys.stdout) -> None:
    dev = rep["device"]
    print(
        f"problem {rep['problem']}  tier {rep['tier']}  dtype {rep['dtype']}  "
        f"device {dev['kind']} ({dev['name']})",
        file=out,
    )
    if dev["kind"] == "interpret":
        print(
            "timings: not meaningful on the CPU interpreter (correctness and checks only)", file=out
        )
    hdr = (
        f"{'shape':28s} {'ok':3s} {'max_err':>9s} {'relL2':>9s} {'ms':>9s} {'eager':>9s} "
        f"{'compiled':>9s} {'x eager':>8s} {'x comp':>8s} {'GB/s':>7s} {'TF/s':>7s} "
        f"{'roof':>5s} bound"
    )
    print(hdr, file=out)
    for s in rep["shapes"]:
        first = s["errors"].get("first", {})
        ok = {True: "yes", False: "NO"}.get(s.get("passed"), "-")
        print(
            f"{s['label'][:28]:28s} {ok:3s} {_fmt(first.get('max_abs_err'), '9.2e'):>9s} "
            f"{_fmt(first.get('rel_l2_err'), '9.2e'):>9s} "
            f"{_fmt(s.get('candidate_ms'), '9.4f'):>9s} "
            f"{_fmt(s.get('eager_ms'), '9.4f'):>9s} {_fmt(s.get('compiled_ms'), '9.4f'):>9s} "
            f"{_fmt(s.get('speedup_eager'), '8.2f'):>8s} "
            f"{_fmt(s.get('speedup_compiled'), '8.2f'):>8s} "
            f"{_fmt(s.get('gbps'), '7.0f'):>7s} {_fmt(s.get('tflops'), '7.1f'):>7s} "
            f"{_fmt(s.get('roofline_fraction'), '5.2f'):>5s} {s.get('bound', '-')}",
            file=out,
        )
    print("checks:", file=out)
    for name, c in rep["checks"].items():
        mark = {True: "pass", False: "FAIL", None: "skip"}[c["passed"]]
        print(f"  {mark:4s} {name}: {c['detail']}", file=out)
    sm = rep["summary"]
    print(
        f"verdict: {rep['verdict']}" + (f" ({rep['failure']})" if rep["failure"] else ""), file=out
    )
    for r in rep["reasons"]:
        print(f"  - {r}", file=out)
    print(f"geomean_speedup_eager: {_fmt(sm['geomean_speedup_eager'])}", file=out)
    print(f"geomean_speedup_compiled: {_fmt(sm['geomean_speedup_compiled'])}", file=out)
    print(f"min_speedup_eager: {_fmt(sm['min_speedup_eager'])}", file=out)
    print(f"seconds: {sm['seconds']}", file=out)
    faults = rep.get("harness_faults") or []
    if faults:
        # The verdict came on a later attempt: the earlier ones judged nothing.
        print(f"judged on attempt {len(faults) + 1}; the harness failed before:", file=out)
        for f in faults:
            print(f"  - {f}", file=out)


def _progress(quiet: bool):
    def on_event(ev: dict) -> None:
        if quiet:
            return
        where = f" {ev['shape'] + 1}/{ev['of']}" if "shape" in ev else ""
        print(f"  .. {ev.get('phase')}{where}", file=sys.stderr, flush=True)

    return on_event


def _adopt() -> None:
    """Like the worker: processes escaping a dead sandbox come to this process and are killed
    when the sandbox is closed."""
    from kernels.harness.sandbox import adopt_escaped_processes

    adopt_escaped_processes()


def cmd_evaluate(args) -> int:
    from kernels.harness import evaluate, oracle

    _adopt()
    oracle.one_evaluation()
    problem = _load_problem(args)
    source, _ = _read_candidate(args.candidate, problem)
    dev = _device(args.device)
    faults: list[str] = []
    rep = again_on_fault(
        lambda: evaluate(
            problem,
            source,
            device=dev,
            tier=args.shapes,
            timeout_s=args.timeout,
            on_event=_progress(args.quiet),
            budget_s=args.budget,
        ),
        faults,
    )
    if faults:
        rep["harness_faults"] = faults
    _write_json(args.json, _with_source(rep, source))
    print_report(rep)
    return 0 if rep["verdict"] == "accepted" else 1


def cmd_tune(args) -> int:
    from kernels import knobs
    from kernels.engine.flight import Stagger, seconds_or_off, spare_for, warm_pool
    from kernels.engine.tuner import Tuner
    from kernels.harness import BaselineCache, evaluate, retime, time_together
    from kernels.harness.sandbox import Pool

    _adopt()
    problem = _load_problem(args)
    source, path = _read_candidate(args.candidate, problem)
    dev = _device(args.device)
    if args.trials < 1:
        raise UsageError("--trials must be at least 1")
    if not 1 <= args.jobs <= MAX_JOBS:
        raise UsageError(f"--jobs must be from 1 to {MAX_JOBS}")
    ahead = min(args.jobs // 3, MAX_JOBS - args.jobs) if args.ahead is None else args.ahead
    if not 0 <= ahead <= MAX_JOBS - args.jobs:
        raise UsageError(f"--ahead must be from 0 to {MAX_JOBS - args.jobs} (--jobs + --ahead)")
    if dev != "cuda":
        ahead = 0  # the interpreter has no GPU stage to wait for: --jobs run end to end
    if not (args.linger is None or seconds_or_off(args.linger)):
        raise UsageError("--linger is a number of seconds above 0, or 0 to turn it off")
    # A compile past --linger seconds gives its place in flight to the next, at most
    # max(1, --ahead) of them at a time (each costs a core): on a GPU only, where the slots
    # still bound what runs on the GPU once it has compiled.
    linger = (DEFAULT_LINGER_S if args.linger is None else args.linger) if dev == "cuda" else 0
    spare = spare_for(ahead, linger)
    if not (args.stagger is None or seconds_or_off(args.stagger)):
        raise UsageError("--stagger is a number of seconds above 0, or 0 to turn it off")
    stagger = (DEFAULT_STAGGER_S if args.stagger is None else args.stagger) if dev == "cuda" else 0
    if args.minutes is not None and not args.minutes > 0:
        raise UsageError("--minutes must be above 0")
    if not 0 < args.rel_ci < 1:
        raise UsageError("--rel-ci is a fraction between 0 and 1, e.g. 0.01")
    try:
        ks = knobs.parse_knobs(source)
    except knobs.KnobError as e:
        raise UsageError(f"{path}: {e}") from e
    if not ks:
        raise UsageError(f"{path} has no '# tune:' knobs to search")
    size = knobs.space_size(ks)
    if args.trials > size:
        print(
            f"note: --trials {args.trials} is more than the {size} configurations of "
            f"{path}'s knobs: the whole space ({size} configs) is tried, each once",
            file=sys.stderr,
        )
    # Screening on a GPU takes the baselines from the cache (measured once per GPU, problem,
    # shapes and versions); the interpreter times nothing.
    cache = BaselineCache() if dev == "cuda" and not args.no_cache else None
    # Warm sandboxes: as many as begin at once and one more start first (no more than the
    # trials need), then a few are kept idle, each taken replaced in the background.
    first, idle = warm_pool(args.jobs, ahead, spare, args.trials)
    pool = Pool(dev, size=idle, first=first)
    # --jobs evaluations on the GPU at once, --ahead more loading and compiling meanwhile.
    slots = threading.Semaphore(args.jobs) if dev == "cuda" else None
    if slots is not None and stagger:
        # The first --jobs take their slots one every --stagger seconds (kernels.engine.flight).
        slots = Stagger(slots, args.jobs, stagger)
    common = dict(
        device=dev, tier=args.shapes, timeout_s=args.timeout, pool=pool, budget_s=args.budget
    )
    try:

        def ev(src: str, on_event=None) -> dict:
            return evaluate(
                problem,
                src,
                baselines=cache,
                rel_ci=args.rel_ci,
                gpu_slots=slots,
                on_event=on_event,
                **common,
            )

        def rt(srcs: list[str]) -> list[dict]:
            return retime(problem, srcs, baselines=cache, **common)

        def together(srcs: list[str]) -> dict:
            return time_together(problem, srcs, baselines=cache, **common)

        def on_trial(rec) -> None:
            print(f"[{rec['index']:3d}] {rec['description']}", flush=True)

        tuner = Tuner(
            source,
            trials=args.trials,
            evaluate=ev,
            retime=rt if dev == "cuda" else None,
            together=together if dev == "cuda" and not args.no_table else None,
            seed=args.seed,
            on_trial=on_trial,
            jobs=args.jobs + ahead,
            max_minutes=args.minutes,
            linger_s=linger or None,
            spare=spare,
        )
        print(f"strategy: {tuner.strategy}: {tuner.proposer.why}", flush=True)
        result = tuner.run()
    finally:
        pool.close()
    out = result.to_dict()
    out["problem"] = problem.name
    out["device"] = (result.best_report or {}).get("device")
    _write_json(args.json, out)
    if args.out:
        Path(args.out).write_text(result.best_source)
    print(
        f"strategy: {result.strategy}  space: {result.space_size}  "
        f"evaluations: {result.evaluations}  failures: {result.failures}  "
        f"confirmations: {result.confirmations}"
    )
    print(f"evals_per_minute: {_fmt(result.evals_per_minute, '.1f')}")
    if result.lingered:
        print(f"gave their place in flight up while compiling past {linger:g} s: {result.lingered}")
    print(f"ranked: {result.ranked}  {result.note}")
    print("best: " + " ".join(f"{k}={v}" for k, v in result.best_values.items()))
    if result.best_report:
        sm = result.best_report["summary"]
        print(
            f"best geomean_ms: {_fmt(sm.get('geomean_ms'), '.4f')}  "
            f"x eager: {_fmt(sm.get('geomean_speedup_eager'))}  "
            f"x compiled: {_fmt(sm.get('geomean_speedup_compiled'))}"
        )
    if result.table:
        print_table(result.table)
    return 0 if result.best_report and result.best_report.get("verdict") == "accepted" else 1


def print_table(table: dict, out=sys.stdout) -> None:
    """The per-shape dispatch table a tune ends with."""
    if table.get("error"):
        print(f"per-shape table: not built: {table['error']}", file=out)
        return
    print("per-shape table (candidates and baselines re-timed together):", file=out)
    print(f"  {'shape':<28} {'serves':<10} {'ms':>9} {'x compile':>9} {'x eager':>8}", file=out)
    for r in table["shapes"]:
        serves = r["kernel"] if r["serve"] == "kernel" else r["serve"] or "-"
        print(
            f"  {r['label']:<28} {serves:<10} {_fmt(r['ms'], '.4f'):>9} "
            f"{_fmt(r['speedup_compiled'], '.2f'):>9} {_fmt(r['speedup_eager'], '.2f'):>8}",
            file=out,
        )
    print(
        f"  geomean x compile: {_fmt(table['geomean_speedup_compiled'], '.3f')}  "
        f"x eager: {_fmt(table['geomean_speedup_eager'], '.3f')}  "
        f"shapes on generated kernels: {table['shapes_on_kernels']}/{table['shapes_total']}",
        file=out,
    )
    single = table.get("best_single")
    if single:
        print(
            f"  best single kernel ({single['kernel']}): "
            f"x compile {_fmt(single['geomean_speedup_compiled'], '.3f')}  "
            f"x eager {_fmt(single['geomean_speedup_eager'], '.3f')}",
            file=out,
        )


def cmd_ceilings(args) -> int:
    from kernels.harness import device

    dev = _device(args.device)
    if dev != "cuda":
        raise UsageError("ceilings need a CUDA device (the interpreter has none to measure)")
    c = device.ceilings(measure=args.measure)
    _write_json(args.json, c)
    for k, v in c.items():
        print(f"{k}: {v}")
    return 0


def cmd_profile(args) -> int:
    from kernels.harness import oracle, profile

    oracle.one_evaluation()
    problem = _load_problem(args)
    source, _ = _read_candidate(args.candidate, problem)
    if _device(args.device) != "cuda":
        raise UsageError("profile needs a CUDA device and ncu")
    try:
        rep = profile.profile(problem, source, tier=args.shapes, timeout_s=args.timeout)
    except profile.ProfileError as e:
        raise UsageError(str(e)) from e
    _write_json(args.json, _with_source(rep, source))
    print_report(rep)
    print("profile (ncu):")
    for row in rep.get("profile", {}).get("kernels", []):
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    return 0 if rep["verdict"] == "accepted" else 1


def cmd_new_problem(args) -> int:
    from kernels import scaffold
    from kernels.harness import evaluate

    try:
        built = scaffold.build(
            args.name,
            args.reference,
            args.inputs,
            args.shapes,
            smoke=args.smoke,
            out_dir=args.dir,
            cuda_dtype=args.dtype,
        )
    except scaffold.ScaffoldError as e:
        raise UsageError(str(e)) from e
    # Read before writing: a bad AUTOWEB_PROBLEM_DIRS is refused with nothing written.
    known = [str(d) for d in problems.problem_dirs()[1:]]
    try:
        built.write()
    except OSError as e:
        raise UsageError(f"cannot write the problem into {built.problem_path.parent}: {e}") from e
    print(f"wrote {built.problem_path}")
    print(f"wrote {built.seed_path}  ({built.note})")
    directory = built.problem_path.parent
    if str(directory) not in known:
        print(f"add {directory} to AUTOWEB_PROBLEM_DIRS (or pass --problems-dir) to use it")
    print("first evaluation of the seed on the CPU interpreter:", flush=True)
    _adopt()
    problem = problems.load(built.name, [str(directory)])
    rep = evaluate(
        problem,
        built.seed_source,
        device="interpret",
        tier="smoke",
        timeout_s=args.timeout,
        on_event=_progress(args.quiet),
    )
    _write_json(args.json, rep)
    print_report(rep)
    return 0 if rep["verdict"] == "accepted" else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kernels", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, candidate=True):
        p.add_argument(
            "--problems-dir",
            action="append",
            default=None,
            help="extra directory of problem modules (repeatable)",
        )
        p.add_argument("--json", metavar="OUT", help="write the JSON report here")
        if candidate:
            p.add_argument("--problem", required=True)
            p.add_argument("--device", default="auto", choices=["auto", "cuda", "interpret"])
            p.add_argument("--shapes", default="smoke", choices=["smoke", "full"])
            p.add_argument("--timeout", type=float, default=None, help="seconds per evaluation")
            p.add_argument(
                "--budget",
                type=float,
                default=0.5,
                help="seconds of timing per shape on a GPU (the most a screened shape may take)",
            )

    p = sub.add_parser("problems", help="list problems with signatures and shape sweeps")
    common(p, candidate=False)
    p.set_defaults(fn=cmd_problems)

    p = sub.add_parser("evaluate", help="evaluate one candidate file")
    common(p)
    p.add_argument("--candidate", required=True)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("tune", help="search a kernel's # tune: knobs")
    common(p)
    p.add_argument("--candidate", help="default: the problem's seed kernel")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="candidates on the GPU at once, verifying and timing (each in its own warm sandbox)",
    )
    p.add_argument(
        "--ahead",
        type=int,
        default=None,
        help="on a GPU, candidates beyond --jobs that load and compile meanwhile, so that one "
        "is ready whenever a GPU slot frees (default: a third of --jobs, rounded down)",
    )
    p.add_argument(
        "--linger",
        type=float,
        default=None,
        help=f"on a GPU, a candidate still compiling after this many seconds gives its place "
        f"in flight to the next while it runs out the compile budget, at most max(1, --ahead) "
        f"at a time (default {DEFAULT_LINGER_S:g}; 0: never)",
    )
    p.add_argument(
        "--stagger",
        type=float,
        default=None,
        help=f"on a GPU, the first --jobs candidates take their GPU slots one every this many "
        f"seconds rather than all at once, so the first are timed while the others verify "
        f"(default {DEFAULT_STAGGER_S:g}; 0: all at once)",
    )
    p.add_argument("--out", help="write the best candidate source here")
    p.add_argument(
        "--rel-ci",
        type=float,
        default=0.01,
        help="screening stops timing a shape once its median's 95%% CI is within this fraction "
        "(a shape the candidate has lost to the faster baseline: at six samples)",
    )
    p.add_argument(
        "--minutes", type=float, default=None, help="stop proposing after this many minutes"
    )
    p.add_argument(
        "--no-cache", action="store_true", help="time the baselines with every candidate"
    )
    p.add_argument("--no-table", action="store_true", help="skip the per-shape table at the end")
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser(
        "ceilings", help="measure and cache the device's copy bandwidth and matrix rate"
    )
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "interpret"])
    p.add_argument("--measure", action="store_true", help="measure again even if cached")
    p.set_defaults(fn=cmd_ceilings)

    p = sub.add_parser(
        "new-problem",
        help="scaffold a problem (and a seed kernel) from a PyTorch function, then evaluate it",
        description="Write DIR/NAME.py (a problem whose reference calls your function) and "
        "DIR/seeds/NAME.py (a naive Triton seed where the op class allows, else a template), "
        "then evaluate the seed on the CPU interpreter. Exit 0: the seed was accepted; 1: it "
        "was rejected (the files are written); 2: bad input, nothing written.",
    )
    p.add_argument("name", help="the problem's name (lowercase, digits, _)")
    p.add_argument("--reference", required=True, metavar="MODULE:FUNCTION")
    p.add_argument(
        "--inputs",
        required=True,
        metavar="SPEC",
        help='each input of the function as NAME:DIMS, in order, e.g. "x:M,N weight:N"',
    )
    p.add_argument(
        "--shapes",
        required=True,
        metavar="SHAPES",
        help='the GPU sweep: DIM=SIZE lists separated by spaces, e.g. "M=1,N=4096 M=4096,N=4096"',
    )
    p.add_argument("--smoke", metavar="SHAPES", help="the interpreter sweep (default: derived)")
    p.add_argument("--dir", help="where to write (default: the first AUTOWEB_PROBLEM_DIRS entry)")
    p.add_argument("--dtype", default="bfloat16", help="the GPU dtype (default bfloat16)")
    p.add_argument("--json", metavar="OUT", help="write the evaluation report here")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the evaluation")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_new_problem)

    p = sub.add_parser("profile", help="evaluate, then attach ncu DRAM/SM throughput and occupancy")
    common(p)
    p.add_argument("--candidate", help="default: the problem's seed kernel")
    p.set_defaults(fn=cmd_profile)
    return ap


def _check_args(args) -> None:
    """What argparse cannot say: numbers that must be finite and positive, and output paths
    that must be writable before any work is done (a result is never lost at the end)."""
    for flag in ("timeout", "budget"):
        v = getattr(args, flag, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UsageError(f"--{flag} must be a positive number of seconds; got {v}")
    for flag in ("json", "out"):
        v = getattr(args, flag, None)
        if not v:
            continue
        p = Path(v)
        parent = p.parent
        if p.is_dir():
            raise UsageError(f"--{flag} {v} is a directory; give a file name")
        if not parent.is_dir():
            raise UsageError(f"--{flag} {v}: the directory {parent} does not exist")
        if not os.access(p if p.exists() else parent, os.W_OK):
            raise UsageError(f"--{flag} {v} cannot be written")


def stop_on_sigterm() -> None:
    """For the command-line process (kernels/__main__.py), not for callers of main()."""
    signal.signal(signal.SIGTERM, _stop)


def _stop(signum: int, _frame) -> None:
    """SIGTERM (`kill`, `timeout`): the sandboxed children die first, then this process unwinds
    as on Ctrl-C. A child runs in its own session, so nothing else would stop it."""
    from kernels.harness import sandbox

    sandbox.kill_all()
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors already
        return int(e.code or 0)
    try:
        _check_args(args)
        return args.fn(args)
    except (UsageError, problems.ProblemError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except HarnessFault as e:  # the harness failed on its own part, each time: no verdict
        print(f"error: {e}", file=sys.stderr)
        return 3
