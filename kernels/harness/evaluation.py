"""Evaluate candidates: static checks, sandboxed run, float64 verification, report.

`run(request)` is the harness's one entry point (`kernels.protocol.EvaluationRequest` in, the
report out); `evaluate`, `measure_baselines`, `time_together` and `retime` are built on it. It
starts (or takes from a pool) a sandboxed child, hands it the spec, and pumps the child's
messages through `HANDLERS`, one function per message type. The verdict is made here, in the
caller's process, by the rules in `kernels.harness.verdict`, from raw observations of the child
and from outputs compared against a reference this process computes itself. Nothing the
candidate's process says about correctness is believed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import re
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from kernels import problems
from kernels.harness import baselines as bl
from kernels.harness import device as devmod
from kernels.harness import gpulock, sandbox, static
from kernels.harness import verdict as rules
from kernels.harness.verdict import Event, geomean
from kernels.protocol import FAILURES, EvaluationRequest, HarnessFault

DEFAULT_TIMEOUT_S = float(os.environ.get("AUTOWEB_SANDBOX_TIMEOUT_S", "300"))
# Screening gives loading and compiling a candidate this long (as Helion's autotuner does): a
# configuration that compiles for minutes holds a worker and is rarely worth it.
SCREEN_COMPILE_TIMEOUT_S = float(os.environ.get("AUTOWEB_SCREEN_COMPILE_TIMEOUT_S", "60"))


def _seeds(n_shapes: int) -> list[dict]:
    def s() -> int:
        return secrets.randbits(62)

    return [
        {"first": s(), "second": s(), "final": s(), "rot": [s() for _ in range(4)]}
        for _ in range(n_shapes)
    ]


def request_for(
    problem: problems.Problem | str, sources: list[str] | tuple[str, ...], **fields
) -> EvaluationRequest:
    """The request for `problem` (a name, or a problem loaded from any directory): the request
    names the problem's directory unless it is a built-in one."""
    problem = problems.load(problem) if isinstance(problem, str) else problem
    dirs = () if problem.path.parent == problems.BUILTIN_DIR else (str(problem.path.parent),)
    return EvaluationRequest(
        problem=problem.name, problem_dirs=dirs, sources=tuple(sources), **fields
    )


def evaluate(
    problem: problems.Problem | str,
    source: str,
    *,
    device: str = "auto",
    tier: str = "smoke",
    shapes: list[dict] | None = None,
    timeout_s: float | None = None,
    on_event: Event | None = None,
    pool: sandbox.Pool | None = None,
    budget_s: float = 0.5,
    baselines_compiled: bool = True,
    skip_static_checks: bool = False,
    memory_bytes: int | None = None,
    file_bytes: int | None = None,
    baselines: bl.BaselineCache | None = None,
    rel_ci: float = 0.01,
    compile_timeout_s: float | None = None,
    gpu_slots: gpulock.Slots | None = None,
) -> dict:
    """Evaluate one candidate source; returns the report (docs/harness.md, Report).

    With `baselines` (a cache) on a GPU the candidate is *screened*: its timing stops once the
    medians are tight (`rel_ci`, `budget_s` at most per shape), and the eager and torch.compile
    times come from the cache, measured in a clean sandbox when missing and checked against a
    drift canary timed with the candidate. Without it every shape times the candidate and both
    baselines interleaved for `budget_s` (what confirmations and re-validation use).
    `compile_timeout_s` caps loading and compiling the candidate (a failure `timeout`; by
    default SCREEN_COMPILE_TIMEOUT_S when screening, no cap otherwise).
    `gpu_slots`, shared by the evaluations a caller keeps in flight, bounds how many of them are
    past loading and compiling at once (`run`).

    `skip_static_checks` exists for tests that prove the run-time defences hold on their own.
    """
    problem = problems.load(problem) if isinstance(problem, str) else problem
    dev = devmod.resolve(device)
    request = request_for(
        problem,
        [source],
        device=dev,
        tier=tier,
        shapes=tuple(shapes) if shapes else None,
        timeout_s=timeout_s,
        budget_s=budget_s,
        baselines_compiled=baselines_compiled,
        skip_static_checks=skip_static_checks,
        memory_bytes=memory_bytes,
        file_bytes=file_bytes,
        compile_timeout_s=compile_timeout_s,
    )
    if baselines is None or dev != "cuda":
        return run(request, on_event=on_event, pool=pool, gpu_slots=gpu_slots)
    request = replace(request, compile_timeout_s=compile_timeout_s or SCREEN_COMPILE_TIMEOUT_S)
    return _screen(
        problem, request, baselines, rel_ci, on_event=on_event, pool=pool, gpu_slots=gpu_slots
    )


def _screen(
    problem: problems.Problem,
    request: EvaluationRequest,
    cache: bl.BaselineCache,
    rel_ci: float,
    *,
    on_event: Event | None,
    pool: sandbox.Pool | None,
    gpu_slots: gpulock.Slots | None = None,
) -> dict:
    dev = request.device
    shapes = [dict(s) for s in (request.shapes or problem.shapes(request.tier))]
    labels = [problems.shape_label(s) for s in shapes]
    dinfo = devmod.info(dev)
    dtype = str(problem.dtype(dev)).replace("torch.", "")
    fields = bl.key_fields(problem, dinfo, dtype)
    kw = {"pool": pool, "timeout_s": request.timeout_s, "budget_s": request.budget_s}
    ignored_before = len(cache.ignored)
    entries, source_of = cache.get(fields, labels), "cached"
    if entries is None:
        with cache.lock(fields):
            entries = cache.get(fields, labels)
            if entries is None:
                entries = measure_baselines(problem, shapes, device=dev, **kw)
                source_of = "measured"
                cache.put(fields, labels, entries)
    canary = bl.canary_index(entries)
    extra = {
        "timing": "screen",
        "rel_ci": rel_ci,
        "canary": canary,
        "modes": {str(i): e["mode"] for i, e in enumerate(entries)},
        "bars": bl.bars(entries),
    }
    request = replace(request, shapes=tuple(shapes), baselines_compiled=False, extra=extra)
    report = run(request, on_event=on_event, pool=pool, cached=entries, gpu_slots=gpu_slots)
    now = next((s.get("canary_eager") for s in report["shapes"] if s.get("canary_eager")), None)
    if report["verdict"] != "accepted":
        now = None  # nothing to place, and a rejected candidate's canary proves nothing
    # The GPU may not be what it was when the baselines were measured: when the canary moved,
    # they are measured again now and the candidate is placed against the new numbers.
    placed, info = bl.settle_canary(
        cache,
        fields,
        labels,
        entries,
        canary,
        now,
        lambda: measure_baselines(problem, shapes, device=dev, **kw),
    )
    if placed is not entries:
        rules.apply_baselines(report, placed)
    report["baselines"] = {"source": source_of, **info, "ignored": cache.ignored[ignored_before:]}
    return report


def cached_modes(
    problem: problems.Problem, shapes: list[dict], cache: bl.BaselineCache
) -> dict[str, str] | None:
    """{shape index: "graph" | "events"}: the timing mode each shape's baselines were measured
    in on this GPU, or None unless the cache holds every shape. A mode chosen from quick timings
    taken while other processes use the GPU could be wrong; the cached one was chosen in a
    clean sandbox, and it is the one the candidates were screened in."""
    dev = "cuda"
    dtype = str(problem.dtype(dev)).replace("torch.", "")
    fields = bl.key_fields(problem, devmod.info(dev), dtype)
    entries = cache.get(fields, [problems.shape_label(s) for s in shapes])
    if not entries or any(e.get("mode") not in ("graph", "events") for e in entries):
        return None
    return {str(i): e["mode"] for i, e in enumerate(entries)}


def measure_baselines(
    problem: problems.Problem,
    shapes: list[dict],
    *,
    device: str,
    pool: sandbox.Pool | None = None,
    timeout_s: float | None = None,
    budget_s: float = 0.5,
) -> list[dict]:
    """Time eager and torch.compile of the reference on every shape, in a sandboxed child that
    loads no candidate. One entry per shape: {"eager", "compiled", "mode", "note", ...}."""
    request = request_for(
        problem,
        [],
        device=device,
        tier="full",
        shapes=tuple(shapes),
        timeout_s=timeout_s,
        budget_s=budget_s,
        baselines_compiled=True,
        skip_static_checks=True,
        verify=False,
        extra={"timing": "baselines"},
    )
    rep = run(request, pool=pool)
    if rep["verdict"] != "accepted":
        raise sandbox.SandboxError(
            "measuring the baselines failed: " + "; ".join(rep["reasons"])[:500]
        )
    entries = []
    for s in rep["shapes"]:
        raw = s.get("baseline_stats") or {}
        if not raw.get("eager"):
            raise sandbox.SandboxError(f"measuring the baselines: no eager time for {s['label']}")
        entries.append(
            {
                "eager": raw["eager"],
                "compiled": raw.get("compiled"),
                "mode": s.get("timing_mode") or "events",
                "note": "; ".join(s.get("notes") or []) or None,
                "host": (rep.get("device") or {}).get("host"),
            }
        )
    return entries


def time_together(
    problem: problems.Problem | str,
    sources: list[str],
    *,
    device: str = "auto",
    tier: str = "smoke",
    shapes: list[dict] | None = None,
    timeout_s: float | None = None,
    budget_s: float = 0.5,
    pool: sandbox.Pool | None = None,
    compiled: bool = True,
    baselines: bl.BaselineCache | None = None,
) -> dict:
    """Time several accepted candidates and the baselines interleaved in one sandboxed process,
    shape by shape (what confirmations and the per-shape table are built from). Outputs
    produced while timed are verified again; a candidate wrong on a shape is not `passed` there.

    With `baselines` (the cache screening used) holding every shape, each shape is timed in the
    mode its baselines were (CUDA graphs or events), as the screening was, and is prepared
    while the GPU is shared: the exclusive phase is then samples only (`cached_modes`).

    Returns {"labels", "shapes", "kernels": per source a list per shape of {"median", "spread",
    "passed"}, "baselines": per shape {"eager", "compiled"}, "verdict", "reasons"}.
    """
    problem = problems.load(problem) if isinstance(problem, str) else problem
    dev = devmod.resolve(device)
    modes = None
    if baselines is not None and dev == "cuda":
        modes = cached_modes(problem, list(shapes or problem.shapes(tier)), baselines)
    request = request_for(
        problem,
        sources,
        device=dev,
        tier=tier,
        shapes=tuple(shapes) if shapes else None,
        timeout_s=timeout_s,
        budget_s=budget_s,
        baselines_compiled=compiled,
        verify=False,
        extra={"modes": modes} if modes else {},
    )
    rep = run(request, pool=pool)
    ok = rep["verdict"] == "accepted"
    kernels = []
    for c in range(len(sources)):
        per = []
        for sh in rep["shapes"]:
            t = (sh.get("retime") or {}).get(c) or {}
            per.append(
                {
                    "median": t.get("median"),
                    "spread": t.get("spread"),
                    "passed": bool(ok and t.get("passed")),
                }
            )
        kernels.append(per)
    return {
        "labels": [sh["label"] for sh in rep["shapes"]],
        "shapes": [sh["shape"] for sh in rep["shapes"]],
        "kernels": kernels,
        "baselines": [sh.get("baseline_stats") or {} for sh in rep["shapes"]],
        "verdict": rep["verdict"],
        "reasons": rep["reasons"],
        "device": rep.get("device"),
    }


def retime(
    problem: problems.Problem | str,
    sources: list[str],
    *,
    device: str = "auto",
    tier: str = "smoke",
    shapes: list[dict] | None = None,
    timeout_s: float | None = None,
    budget_s: float = 0.5,
    pool: sandbox.Pool | None = None,
    baselines: bl.BaselineCache | None = None,
) -> list[dict]:
    """Re-time several accepted candidates interleaved in one sandboxed process (each shape in
    its cached baselines' timing mode when `baselines` has them all: `time_together`).

    Returns per source {"geomean_ms", "noise", "shapes_ms"}; outputs produced while timed are
    verified again. A source whose timed outputs are wrong gets geomean_ms None.
    """
    together = time_together(
        problem,
        sources,
        device=device,
        tier=tier,
        shapes=shapes,
        timeout_s=timeout_s,
        budget_s=budget_s,
        pool=pool,
        compiled=False,
        baselines=baselines,
    )
    out = []
    for per in together["kernels"]:
        ok = bool(per) and all(t["passed"] and t["median"] is not None for t in per)
        ms = [t["median"] for t in per] if ok else []
        spreads = [t["spread"] or 0.0 for t in per] if ok else []
        out.append(
            {
                "geomean_ms": geomean(ms) if ok else None,
                "noise": statistics.median(spreads) if ok else None,
                "shapes_ms": ms if ok else None,
                "reasons": together["reasons"],
            }
        )
    return out


def run(
    request: EvaluationRequest,
    *,
    on_event: Event | None = None,
    pool: sandbox.Pool | None = None,
    wrapper: list[str] | None = None,
    cached: list[dict] | None = None,
    gpu_slots: gpulock.Slots | None = None,
) -> dict:
    """Run the harness once; returns the report (docs/harness.md, Report).

    `on_event` receives progress (`{"phase", "shape", "of"}`; `{"phase": "compiled"}` once, when
    the candidate has loaded and compiled); `pool` lends a started sandbox;
    `wrapper` is a command the sandboxed child runs under (a profiler), its directory then kept
    (`report["sandbox_dir"]`); `cached` are baseline entries per shape when screening.

    `gpu_slots` (a semaphore the caller shares between the evaluations it keeps in flight, or
    `gpulock.GpuSlots` shared by the worker processes of one GPU) is taken when the child first
    asks for the GPU, once the candidate has loaded and compiled, and given back when the child
    says its GPU work is done (`gpu_done`) or the run ends. A caller keeps more evaluations in
    flight than slots, so the next candidates compile while others verify and time, and a
    configuration that compiles for its whole budget holds no GPU slot. The wait for a slot does
    not count against the child's timeout (it has a bound of its own); the report's `gpu_wait`
    says how long it was (`slot_s`).

    Raises HarnessFault, with no report, where this process ran out of memory for its own part
    (references, comparisons) even after waiting and trying again: the candidate is not to
    blame, and the caller runs the evaluation again. Raises ProblemError where the problem
    fails on its own.
    """
    started = time.monotonic()
    problem = problems.load(request.problem, list(request.problem_dirs) or None)
    dev = devmod.resolve(request.device)
    shapes = [dict(s) for s in (request.shapes or problem.shapes(request.tier))]
    dtype = problem.dtype(dev)
    dinfo = devmod.info(dev)
    seeds = _seeds(len(shapes))
    sources = list(request.sources)
    run_ = rules.Run(problem, dev, shapes, seeds, dtype, on_event)
    run_.cached = cached
    run_.retiming = not request.verify and bool(sources)
    l2_bytes = (dinfo.get("ceilings") or {}).get("l2_bytes")
    timed = dev == "cuda" and bool(request.extra.get("time", True))
    if timed and sources and request.verify and request.extra.get("modes"):
        # The caller chose each shape's timing mode: it knows before the child times on which
        # new values each timed output will be made (verdict.Run.timed_which).
        run_.timed_plan = {"modes": request.extra["modes"], "l2_bytes": l2_bytes}

    def report() -> dict:
        return rules.assemble_report(run_, problem, dinfo, dtype, request.tier, started, sources)

    if not request.skip_static_checks:
        for src in sources:
            st = static.check_source(src, problem.arg_names)
            if not st.ok:
                run_.check("static", False, "; ".join(st.reasons))
                run_.fail(st.failure, "; ".join(st.reasons))
                return report()
        run_.check("static", True, "imports, builtins, attributes and signature allowed")
    else:
        run_.check("static", None, "skipped (test-only option)")

    kw = {"memory_bytes": request.memory_bytes} if request.memory_bytes else {}
    if request.file_bytes:
        kw["file_bytes"] = request.file_bytes
    child = (
        pool.acquire()
        if pool is not None
        else sandbox.Child(dev, wrapper=wrapper, keep_dir=wrapper is not None, **kw)
    )
    pump = _Pump(run_, child, request, dinfo, n_sources=len(sources), slots=gpu_slots)
    if run_.pdev == "cuda":
        run_.gpu_hold = pump.check_hold
    try:
        child.wait_ready()
        paths = []
        for k, src in enumerate(sources):
            p = child.dir / f"candidate_{k}.py"
            p.write_text(src)
            paths.append(str(p))
        child.send(
            {
                "problem": problem.name,
                "problem_dirs": list(request.problem_dirs),
                "candidates": paths,
                "device": "cuda" if dev == "cuda" else "cpu",
                "dtype": str(dtype).replace("torch.", ""),
                "shapes": shapes,
                "seeds": seeds,
                "out_dir": str(child.dir / "out"),
                "l2_bytes": l2_bytes,
                "budget_s": request.budget_s,
                "baselines_compiled": request.baselines_compiled,
                "verify": request.verify,
                **request.extra,
            }
        )
        pump.loop()
        if not request.extra.get("profile"):  # a profiling run observes; it judges nothing
            rules.require_complete(
                run_,
                verified=request.verify,
                timed=dev == "cuda" and bool(request.extra.get("time", True)),
                n_cands=len(sources),
                e2e=bool(request.extra.get("e2e")),
            )
    except sandbox.SandboxError as e:
        run_.fail("crashed", str(e))
    finally:
        try:
            pump.release_slot()
            pump.release_gpu()
            pump.settle_checks(close=True)  # none left once the loop has ended, unless it raised
        finally:
            child.close()
    run_._oracles.clear()
    if run_.pdev == "cuda":
        torch.cuda.empty_cache()
    if pump.fault is not None:
        raise pump.fault
    if any(cat == "crashed" for cat, _ in run_.failures):
        # Not the candidate's failure if the problem itself fails: checked here, once the child
        # is gone, on the shape it was at (every shape when it was at none), not on its word.
        at = [pump.shape] if pump.shape is not None else range(len(shapes))
        fault = next(filter(None, (run_.problem_fault(i) for i in at)), None)
        if fault:
            raise problems.ProblemError(f"{fault}; the candidate was not judged")
    out = report()
    out["sandbox_dir"] = str(child.dir)
    if run_.pdev == "cuda":
        out["gpu_wait"] = pump.gpu_wait()
    out["sandbox"] = {
        "network_isolated": sandbox.network_isolation_available(),
        "filesystem_confined": bool(child.confined.get("filesystem")),
        "sockets_denied": bool(child.confined.get("sockets_denied")),
        "confinement": child.confined,
        "peak_rss_mb": round(child.peak_rss / 2**20, 1),
    }
    if child.cuda_sync:
        out["sandbox"]["cuda_sync"] = child.cuda_sync
    return out


_OUT_OF_MEMORY = ("out of memory", "can't allocate", "cannot allocate", "memoryerror")


# The steps a child names when it asks for the GPU again (`childrun.STEPS`): the lock's trace
# (AUTOWEB_GPU_LOCK_TRACE) labels each shared hold with the step it covered.
_STEP = re.compile(r"[a-z][a-z0-9-]{0,31}")


def step_label(step: object) -> str:
    """The trace's label for a child's hold: its step, `step-` and the name it gave, when that
    is a short lowercase name (the child wrote it); "" (the hold's kind) otherwise."""
    if isinstance(step, str) and _STEP.fullmatch(step):
        return f"step-{step}"
    return ""


@dataclass
class _Pump:
    """Reads the child's messages until it is done, handing each to its handler (`HANDLERS`).
    A handler returns True when the run is over. It also holds the GPU lock for the child:
    exclusive while the child times, shared while it verifies and prepares. The caller's own
    checks of the outputs take holds of their own (`check_hold`)."""

    run: rules.Run
    child: sandbox.Child
    request: EvaluationRequest
    dinfo: dict
    n_sources: int
    lock: gpulock.GpuLock | None = None
    # Outputs produced while timed are verified once the child has finished timing and the
    # GPU lock is shared again: verifying them at once would put this process's reads,
    # reference and comparison kernels on the GPU while the child times the next shape.
    timed: list[dict] = field(default_factory=list)
    t_start: float = field(default_factory=time.monotonic)
    # Seconds spent waiting for the GPU lock, per kind of hold, and how many holds were taken:
    # what an evaluation in flight beside others loses to them (the report's `gpu_wait`).
    # Kinds: the child's `shared` and `exclusive` holds, and the caller's checks' (`check`).
    waited: dict[str, float] = field(
        default_factory=lambda: {"shared_s": 0.0, "exclusive_s": 0.0, "check_s": 0.0}
    )
    holds: int = 0
    # Seconds the GPU lock was held, per kind, and the longest shared and check holds: an
    # exclusive phase that asks waits for the holds in progress to end, and every shared ask
    # waits behind it meanwhile.
    held: dict[str, float] = field(
        default_factory=lambda: {
            "shared_s": 0.0,
            "exclusive_s": 0.0,
            "check_s": 0.0,
            "shared_max_s": 0.0,
            "check_max_s": 0.0,
        }
    )
    _held_since: float | None = None
    shape: int | None = None  # the shape the child last said it works on
    slots: gpulock.Slots | None = None  # `run`'s gpu_slots
    slotted: bool = False  # this run holds one of them
    slot_wait: float = 0.0  # seconds waited for it: the child's deadline moves on by as much
    deadline: float | None = None  # while `loop` runs: its start plus the timeout
    stopped: bool = False  # a wait for the GPU or a slot outlasted its bound (`_bounded`)
    # The checks of the child's `verified` reports run in order on a thread of their own, so
    # the child goes on with its next shape without waiting for them, and each takes the GPU
    # (shared) for its own work alone (`check_hold`) rather than keeping the child's hold.
    # They are settled before anything that reads their verdict: the go for the exclusive
    # phase, the timed outputs' checks, the end of the run.
    _checks: concurrent.futures.ThreadPoolExecutor | None = None
    _pending: list[concurrent.futures.Future] = field(default_factory=list)
    checks_failed: bool = False  # a check raised: the run is over (`_check`)
    # While the child loads and compiles, the checks' thread may compute the shapes' references
    # ahead of their reports (`_ahead`, opt-in), one shape at a time behind the checks that
    # came meanwhile, until the first settling of the checks stops it.
    _prefetching: bool = False
    _queue: threading.Lock = field(default_factory=threading.Lock)  # _prefetching, _pending
    fault: HarnessFault | None = None  # this process's own work failed: no verdict (`run`)
    _count: threading.Lock = field(default_factory=threading.Lock)  # waited, held, holds

    @property
    def out_root(self) -> Path:
        return self.child.dir / "out"

    @property
    def timeout_s(self) -> float:
        t = self.request.timeout_s
        # A NaN deadline would never pass: anything but a positive number means the default.
        return t if isinstance(t, int | float) and math.isfinite(t) and t > 0 else DEFAULT_TIMEOUT_S

    def loop(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        # Until the child first asks for the GPU it only loads and compiles the candidate: a
        # screening budget caps that (a config whose compile takes minutes is not worth it).
        compile_s = self.request.compile_timeout_s
        compile_deadline = time.monotonic() + compile_s if compile_s else float("inf")
        compiled = False
        done = False
        self.deadline = deadline
        self.start_references_ahead()
        while not done and not self.stopped:
            until = self.until
            msg = self.child.next(until if compiled else min(until, compile_deadline))
            t = msg["t"]
            if not compiled and (t == "want_gpu" or msg.get("phase") == "verifying"):
                compiled = True
                # The caller's cue that this evaluation is past compiling (kernels.engine.flight).
                self.run.on_event({"phase": "compiled"})
            if t == "timeout" and not compiled and time.monotonic() < until:
                self.run.fail(
                    "timeout",
                    f"compiling took over {compile_s:.0f} s (the compile budget); "
                    "the process tree was killed",
                )
                break
            phase = msg.get("phase")
            phase = phase if isinstance(phase, str) and 0 < len(phase) <= 40 else t
            self.run.timeline.append((phase, round(time.monotonic() - self.t_start, 3)))
            if phase not in self.run.timeline_cpu and len(self.run.timeline_cpu) < 64:
                cpu = self.child.cpu_seconds()
                if cpu is not None:
                    self.run.timeline_cpu[phase] = cpu
            handler = HANDLERS.get(t)
            try:
                done = bool(handler and handler(self, msg)) or self.stopped or self.checks_failed
            except Exception as e:
                self._unhandled(t, e)
                done = True
        self.deadline = None  # the child's deadline is over
        if self.timed:  # the child stopped mid-timing: what it did time is still checked
            self.child.kill()  # first, so that nothing it holds is waited for
            self.share_gpu_and_verify_timed()
        self.release_gpu()  # before waiting for checks, which may wait for a timing phase
        self.settle_checks(close=True)

    @property
    def until(self) -> float | None:
        """The child's deadline: the timeout from the start, moved on by the wait for a slot."""
        return None if self.deadline is None else self.deadline + self.slot_wait

    def release_gpu(self) -> None:
        if self.lock is not None:
            self.lock.release()
            if self._held_since is not None:
                kind = "shared" if self.lock.shared else "exclusive"
                self._count_hold(kind, time.monotonic() - self._held_since)
                self._held_since = None
            self.lock = None

    def _count_hold(self, kind: str, held: float) -> None:
        with self._count:
            self.held[f"{kind}_s"] += held
            if kind != "exclusive":
                self.held[f"{kind}_max_s"] = max(self.held[f"{kind}_max_s"], held)

    def _count_wait(self, kind: str, waited: float) -> None:
        with self._count:
            self.waited[f"{kind}_s"] += waited
            self.holds += 1

    @contextlib.contextmanager
    def check_hold(self) -> Iterator[None]:
        """A shared hold of the GPU of its own for one check's GPU work (`Run.gpu_hold`), on the
        checks' thread or, for the timed outputs, this one once it holds nothing: a hold taken
        where the same thread already holds one could wait for a timing phase that waits for
        it. Bounded like the child's holds while the child lives."""
        lock = self._acquire(True, "check", "a check was waiting for the GPU")
        got = time.monotonic()
        try:
            yield
        finally:
            lock.release()
            self._count_hold("check", time.monotonic() - got)

    def _unhandled(self, t: str, e: Exception) -> None:
        # A message of the wrong form (the child wrote it), or this process's own work on it
        # failed (a reference it could not compute): a rejection either way, with the error,
        # never an evaluation that ends in a traceback. Except where the harness could not
        # judge (HarnessFault: this process out of memory for its own work, or the child's
        # CUDA-graph capture squeezed out by other processes): no verdict, `run` raises it once
        # the child is gone.
        if isinstance(e, HarnessFault):
            self.fault = self.fault or e
            return
        self.run.fail(
            "crashed",
            f"the {t!r} message from the sandboxed process could not be handled: "
            f"{type(e).__name__}: {e}"[:500],
        )

    def _check(self, msg: dict) -> None:
        try:
            rules.on_verified(self.run, msg, self.out_root)
        except Exception as e:
            self._unhandled("verified", e)
            self.checks_failed = True  # the loop ends the run at the next message
        finally:
            i = msg.get("i")
            if type(i) is int:
                self.run.checked(i)

    def start_references_ahead(self) -> None:
        """When the child will verify and AUTOWEB_REFERENCES_AHEAD=1: the first shape's
        references computed ahead (`rules.Run.reference_ahead`), on the checks' thread."""
        if not (
            self.request.verify
            and self.n_sources
            and not self.request.extra.get("profile")
            and rules.references_ahead_enabled()
        ):
            return
        self._checks = concurrent.futures.ThreadPoolExecutor(1, "autoweb-checks")
        with self._queue:
            self._prefetching = True
            self._pending.append(self._checks.submit(self._ahead, 0))

    def _ahead(self, i: int) -> None:
        """Shape i's references computed ahead, then the next shape queued behind the checks
        that came meanwhile. Best effort: what fails here the check computes itself, and judges
        (a problem whose reference raises, this process out of memory)."""
        if not self._prefetching or self.run.failures or self.fault is not None:
            return
        try:
            go = self.run.reference_ahead(i)
        except Exception:
            go = False
        with self._queue:
            if go and self._prefetching and i + 1 < len(self.run.shapes):
                self._pending.append(self._checks.submit(self._ahead, i + 1))

    def settle_checks(self, close: bool = False) -> None:
        """Wait for the checks submitted so far (they never raise: `_check`), first stopping the
        references computed ahead; `close` ends their thread too. Never called while this
        process holds the GPU for the child: a check may be waiting for a timing phase that
        waits for that hold."""
        assert self.lock is None, "checks settled while the child's hold is kept"
        with self._queue:
            self._prefetching = False
            pending, self._pending = self._pending, []
        for fut in pending:
            fut.result()
        if close and self._checks is not None:
            self._checks.shutdown(wait=True)
            self._checks = None

    def take_gpu_shared(self, step: str = "") -> None:
        if self.lock is None:
            self.take_gpu(shared=True, step=step)

    @contextlib.contextmanager
    def _bounded(self, seconds: float | None, why: str) -> Iterator[None]:
        """A wait for the GPU lock or a slot, bounded while the child lives: past `seconds` its
        process tree is killed and the run fails `timeout`. The locks and slots are files a
        child can open for reading, and flock needs no more: a candidate that got full Python
        could hold them itself, and this process would wait on it for ever. Killed, it lets
        them go; a wait on others' work ends with the others."""
        if seconds is None or self.child.proc.poll() is not None:
            yield
            return
        fired = threading.Event()

        def fire() -> None:
            fired.set()
            self.child.kill()

        timer = threading.Timer(max(0.0, seconds), fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()  # a kill under way finishes first
        if fired.is_set() and not self.stopped:
            self.stopped = True
            self.run.fail("timeout", f"{why}; the process tree was killed")

    def take_slot(self) -> None:
        if self.slots is None or self.slotted:
            return
        asked = time.monotonic()
        # The slot wait does not count against the child's deadline; it has a bound of its own.
        with self._bounded(self.timeout_s, f"waited over {self.timeout_s:.0f} s for a GPU slot"):
            self.slots.acquire()
            self.slotted = True
        self.slot_wait = time.monotonic() - asked
        self.waited["slot_s"] = self.slot_wait

    def release_slot(self) -> None:
        if self.slotted:
            self.slotted = False
            self.slots.release()

    def take_gpu(self, shared: bool, step: str = "") -> None:
        kind = "shared" if shared else "exclusive"
        self.lock = self._acquire(shared, kind, "it was waiting for the GPU", step)
        self._held_since = time.monotonic()

    def _acquire(self, shared: bool, kind: str, waiting: str, step: str = "") -> gpulock.GpuLock:
        """The GPU lock, the wait bounded by the child's deadline (`_bounded`) and counted. The
        lock's trace names the hold by the child's step when it named one (`step_label`)."""
        asked = time.monotonic()
        left = None if self.until is None else self.until - asked
        why = f"no result within {self.timeout_s:.0f} s ({waiting})"
        label = step or kind
        with self._bounded(left, why):
            lock = gpulock.GpuLock(gpulock.gpu_key(), shared=shared, label=label).acquire()
        self._count_wait(kind, time.monotonic() - asked)
        return lock

    def gpu_wait(self) -> dict:
        with self._count:
            run = self.run
            waited = {
                **self.waited,
                "reference_s": run.reference_wait - run.ahead_wait if run else 0.0,
                **({"ahead_s": run.ahead_wait} if run and run.ahead_computed else {}),
            }
            held = {f"held_{k}": round(v, 3) for k, v in self.held.items()}
        ahead = {"references_ahead": run.ahead_computed} if run and run.ahead_computed else {}
        if run and run.timed_early:
            ahead["timed_early"] = run.timed_early
        return {**{k: round(v, 3) for k, v in waited.items()}, "holds": self.holds, **held, **ahead}

    def share_gpu_and_verify_timed(self) -> None:
        # The exclusive phase is over: the timed outputs are compared with their references
        # while the GPU is shared (each check takes a shared hold of its own: `check_hold`).
        self.release_gpu()
        self.settle_checks()
        for m in self.timed:
            rules.on_timed(self.run, m, self.out_root, self.dinfo, self.n_sources)
        if self.timed:
            self.run.timeline.append(("timed_verified", round(time.monotonic() - self.t_start, 3)))
        self.timed.clear()

    # -- one handler per message type; True ends the run ---------------------------------------

    def progress(self, msg: dict) -> bool:
        ev = {"phase": msg.get("phase")}
        i = msg.get("i")
        self.shape = i if type(i) is int and 0 <= i < len(self.run.shapes) else None
        if isinstance(msg.get("i"), int):
            ev.update(shape=msg["i"], of=msg.get("n"))
        self.run.on_event(ev)
        return False

    def verified(self, msg: dict) -> bool:
        if self._checks is None:
            self._checks = concurrent.futures.ThreadPoolExecutor(1, "autoweb-checks")
        self._pending.append(self._checks.submit(self._check, msg))
        return False

    def want_gpu(self, msg: dict) -> bool:
        if self.run.pdev != "cuda":
            return self._unexpected(msg)
        self.take_slot()  # the first ask: the candidate has loaded and compiled
        if msg.get("shared"):
            # Asked again between two shapes: the hold is given up first, so a timing phase
            # waiting at the turnstile goes ahead of this process's next shape.
            self.release_gpu()
            if not self.stopped:
                self.take_gpu_shared(step_label(msg.get("step")))
        else:
            # The checks settle first (their verdict decides the go), with no hold kept: one
            # may be waiting for another evaluation's timing phase.
            self.release_gpu()
            self.settle_checks()
            go = not self.run.failures and self.fault is None
            if go and not self.stopped:
                self.take_gpu(shared=False)
        if self.stopped:
            return True
        self.child.send({"go": True} if msg.get("shared") else {"go": go})
        return False

    def timed_msg(self, msg: dict) -> bool:
        if self.run.pdev != "cuda":
            return self._unexpected(msg)
        self.timed.append(msg)
        return False

    def _unexpected(self, msg: dict) -> bool:
        why = f"the sandboxed process sent a {msg.get('t')!r} message: nothing sends it here"
        self.run.fail("hack_suspected", why)
        return True

    def gpu_done(self, msg: dict) -> bool:
        # The child's GPU work is over (it freed its buffers before saying so): the next
        # evaluation may start on the GPU while this one's timed outputs are checked, which
        # takes the caller's reference slots, not the child's.
        self.release_slot()
        self.share_gpu_and_verify_timed()
        return False

    def e2e(self, msg: dict) -> bool:
        rules.on_e2e(self.run, msg)
        return False

    def profiled(self, msg: dict) -> bool:
        self.run.notes.append("profiled")
        return False

    def done(self, msg: dict) -> bool:
        if self.lock is None or self.lock.shared:
            # The child is done with the GPU; its last shape's checks settle before its report.
            # (Still holding the GPU alone, it stopped mid-timing: the loop's end kills it
            # before anything is let go or checked.)
            self.release_gpu()
            self.settle_checks()
        rules.on_done(self.run, msg)
        return True

    def error(self, msg: dict) -> bool:
        cat = msg.get("category") if msg.get("category") in FAILURES else "crashed"
        message = str(msg.get("message", ""))[:2000]
        if any(k in message.lower() for k in _OUT_OF_MEMORY):
            crowded = rules.crowded_out(message, msg.get("gpu_memory"))
            if crowded:
                # Other processes had filled the GPU: no verdict, `run` raises it once the child
                # is gone, and the caller runs the evaluation again (HarnessFault).
                self.fault = self.fault or HarnessFault(f"{crowded}; the candidate was not judged")
                return True
            message = "out of memory: " + message + rules.gpu_memory_note(msg.get("gpu_memory"))
        self.run.fail(cat, message)
        self.run.notes.append(str(msg.get("tb", ""))[-2000:])
        return True

    def timeout(self, msg: dict) -> bool:
        self.run.fail(
            "timeout", f"no result within {self.timeout_s:.0f} s; the process tree was killed"
        )
        return True

    def memory(self, msg: dict) -> bool:
        self.run.fail(
            "crashed",
            f"out of memory: the sandbox used {msg['rss'] / 2**30:.1f} GiB "
            f"(cap {self.child.memory_bytes / 2**30:.0f} GiB) and was killed",
        )
        return True

    def disk(self, msg: dict) -> bool:
        self.run.fail(
            "crashed",
            f"disk full: the sandbox wrote {msg['bytes'] / 2**20:.0f} MiB to its "
            f"directory (cap {self.child.file_bytes / 2**20:.0f} MiB) and was killed",
        )
        return True

    def eof(self, msg: dict) -> bool:
        with contextlib.suppress(Exception):
            self.child.proc.wait(timeout=5)
        self.run.fail(
            "crashed",
            f"the sandboxed process died ({self.child.exit_description()}): "
            f"{self.child.log_tail(1500)}",
        )
        return True

    def garbage(self, msg: dict) -> bool:
        self.run.fail(
            "crashed", f"the sandboxed process wrote an unreadable message: {msg.get('raw')!r}"
        )
        return True


# The child's messages (kernels.harness.childrun) and the sandbox's own (timeout, memory, disk,
# eof, garbage: kernels.harness.sandbox); any other type is ignored.
HANDLERS: dict[str, Callable[[_Pump, dict], bool]] = {
    "progress": _Pump.progress,
    "verified": _Pump.verified,
    "want_gpu": _Pump.want_gpu,
    "timed": _Pump.timed_msg,
    "gpu_done": _Pump.gpu_done,
    "e2e": _Pump.e2e,
    "profiled": _Pump.profiled,
    "done": _Pump.done,
    "error": _Pump.error,
    "timeout": _Pump.timeout,
    "memory": _Pump.memory,
    "disk": _Pump.disk,
    "eof": _Pump.eof,
    "garbage": _Pump.garbage,
}
