"""Evaluate candidates: static checks, sandboxed run, float64 verification, report.

The verdict is made here, in the caller's process, from raw observations of the sandboxed
child and from outputs compared against a reference this process computes itself. Nothing
the candidate's process says about correctness is believed.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kernels import problems
from kernels.harness import device as devmod
from kernels.harness import roofline, sandbox, static
from kernels.harness.compare import compare

DEFAULT_TIMEOUT_S = float(os.environ.get("AUTOWEB_SANDBOX_TIMEOUT_S", "300"))
UNSTABLE_SPREAD = 0.5
FAILURES = (
    "compile_error",
    "prohibited",
    "incorrect",
    "crashed",
    "timeout",
    "unstable",
    "hack_suspected",
    "malformed",
)
# The order a failure is reported in when several apply: the most specific first.
_PRIORITY = [
    "timeout",
    "crashed",
    "compile_error",
    "malformed",
    "prohibited",
    "hack_suspected",
    "incorrect",
    "unstable",
]

Event = Callable[[dict], None]


def _seeds(n_shapes: int) -> list[dict]:
    def s() -> int:
        return secrets.randbits(62)

    return [
        {"first": s(), "second": s(), "final": s(), "rot": [s() for _ in range(4)]}
        for _ in range(n_shapes)
    ]


def _read_output(meta: dict, dtype: torch.dtype, root: Path) -> torch.Tensor:
    path = Path(meta["file"]).resolve()
    if root.resolve() not in path.parents:
        raise ValueError("output file outside the sandbox directory")
    shape = [int(d) for d in meta["shape"]]
    if any(d < 0 for d in shape) or len(shape) > 8:
        raise ValueError(f"bad output shape {shape}")
    numel = math.prod(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    raw = path.read_bytes()
    if len(raw) != numel * esize:
        raise ValueError(f"output file holds {len(raw)} bytes, expected {numel * esize}")
    t = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.empty(0, dtype=torch.uint8)
    )
    return t.view(dtype).reshape(shape)


class _Run:
    """State of one evaluation while the child streams its observations."""

    def __init__(self, problem, dev: str, shapes, seeds, dtype, on_event: Event | None):
        self.problem = problem
        self.dev = dev
        self.shapes = shapes
        self.seeds = seeds
        self.dtype = dtype
        self.on_event = on_event or (lambda e: None)
        self.pdev = "cuda" if dev == "cuda" else "cpu"
        self.tol = problem.tolerance(dtype)
        self._oracles: dict[tuple[int, str], torch.Tensor] = {}
        self.results: list[dict] = [
            {"shape": s, "label": problems.shape_label(s), "errors": {}} for s in shapes
        ]
        self.failures: list[tuple[str, str]] = []
        self.checks: dict[str, dict] = {}
        self.notes: list[str] = []
        self.timeline: list[tuple[str, float]] = []
        self.end_to_end: dict | None = None

    def fail(self, category: str, reason: str) -> None:
        self.failures.append((category, reason))

    def check(self, name: str, passed: bool | None, detail: str) -> None:
        prev = self.checks.get(name)
        if prev is None or (prev["passed"] is not False and passed is False):
            self.checks[name] = {"passed": passed, "detail": detail}

    def oracle(self, i: int, which: str) -> torch.Tensor:
        key = (i, which)
        if key not in self._oracles:
            seed = self.seeds[i][which]
            inputs = self.problem.make_inputs(self.shapes[i], self.dtype, self.pdev, seed)
            self._oracles = {k: v for k, v in self._oracles.items() if k[0] == i}
            self._oracles[key] = self.problem.oracle(*inputs)
        return self._oracles[key]

    def verify(self, i: int, tag: str, which: str, meta: dict, root: Path) -> bool:
        try:
            out = _read_output(meta, self.dtype, root)
        except (ValueError, KeyError, TypeError, OSError) as e:
            self.fail("malformed", f"{self.results[i]['label']}: unreadable output: {e}")
            return False
        with torch.no_grad():
            res = compare(out.to(self.pdev), self.oracle(i, which), self.tol)
        self.results[i]["errors"][tag] = res
        with contextlib.suppress(OSError):
            Path(meta["file"]).unlink()
        del out
        if self.pdev == "cuda":
            # Freed blocks stay in this process's cache unless returned: on a shared GPU they
            # would starve the next candidate's process.
            torch.cuda.empty_cache()
        return res["passed"]


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
) -> dict:
    """Evaluate one candidate source; returns the report (DESIGN.md, Report).

    `skip_static_checks` exists for tests that prove the run-time defences hold on their own.
    """
    return _evaluate(
        problem,
        [source],
        device=device,
        tier=tier,
        shapes=shapes,
        timeout_s=timeout_s,
        on_event=on_event,
        pool=pool,
        budget_s=budget_s,
        baselines_compiled=baselines_compiled,
        skip_static_checks=skip_static_checks,
        verify=True,
        memory_bytes=memory_bytes,
        file_bytes=file_bytes,
    )


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
) -> list[dict]:
    """Re-time several accepted candidates interleaved in one sandboxed process.

    Returns per source {"geomean_ms", "noise", "shapes_ms"}; outputs produced while timed are
    verified again. A source whose timed outputs are wrong gets geomean_ms None.
    """
    rep = _evaluate(
        problem,
        sources,
        device=device,
        tier=tier,
        shapes=shapes,
        timeout_s=timeout_s,
        on_event=None,
        pool=pool,
        budget_s=budget_s,
        baselines_compiled=False,
        skip_static_checks=False,
        verify=False,
    )
    out = []
    for c in range(len(sources)):
        ms, spreads, ok = [], [], rep["verdict"] == "accepted"
        for sh in rep["shapes"]:
            t = (sh.get("retime") or {}).get(c)
            if not t or not t.get("passed", False):
                ok = False
                break
            ms.append(t["median"])
            spreads.append(t["spread"] or 0.0)
        out.append(
            {
                "geomean_ms": _geomean(ms) if ok and ms else None,
                "noise": statistics.median(spreads) if ok and spreads else None,
                "shapes_ms": ms if ok else None,
                "reasons": rep["reasons"],
            }
        )
    return out


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _evaluate(
    problem,
    sources,
    *,
    device,
    tier,
    shapes,
    timeout_s,
    on_event,
    pool,
    budget_s,
    baselines_compiled,
    skip_static_checks,
    verify,
    wrapper=None,
    extra=None,
    memory_bytes=None,
    file_bytes=None,
) -> dict:
    started = time.monotonic()
    if isinstance(problem, str):
        problem = problems.load(problem)
    dev = devmod.resolve(device)
    shapes = [dict(s) for s in (shapes or problem.shapes(tier))]
    dtype = problem.dtype(dev)
    dinfo = devmod.info(dev)
    seeds = _seeds(len(shapes))
    emit = on_event or (lambda e: None)
    run = _Run(problem, dev, shapes, seeds, dtype, on_event)

    if not skip_static_checks:
        for src in sources:
            st = static.check_source(src, problem.arg_names)
            if not st.ok:
                run.check("static", False, "; ".join(st.reasons))
                run.fail(st.failure, "; ".join(st.reasons))
                return _report(run, problem, dinfo, dtype, tier, started, sources)
        run.check("static", True, "imports, builtins, attributes and signature allowed")
    else:
        run.check("static", None, "skipped (test-only option)")

    kw = {"memory_bytes": memory_bytes} if memory_bytes else {}
    if file_bytes:
        kw["file_bytes"] = file_bytes
    child = (
        pool.acquire()
        if pool is not None
        else sandbox.Child(dev, wrapper=wrapper, keep_dir=wrapper is not None, **kw)
    )
    lock = None
    try:
        child.wait_ready()
        paths = []
        for k, src in enumerate(sources):
            p = child.dir / f"candidate_{k}.py"
            p.write_text(src)
            paths.append(str(p))
        spec = {
            "problem": problem.name,
            "problem_dirs": [str(problem.path.parent)]
            if problem.path.parent != problems.BUILTIN_DIR
            else [],
            "candidates": paths,
            "device": "cuda" if dev == "cuda" else "cpu",
            "dtype": str(dtype).replace("torch.", ""),
            "shapes": shapes,
            "seeds": seeds,
            "out_dir": str(child.dir / "out"),
            "l2_bytes": (dinfo.get("ceilings") or {}).get("l2_bytes"),
            "budget_s": budget_s,
            "baselines_compiled": baselines_compiled,
            "verify": verify,
            **(extra or {}),
        }
        child.send(spec)
        deadline = time.monotonic() + (timeout_s or DEFAULT_TIMEOUT_S)
        out_root = child.dir / "out"
        done = False
        t_start = time.monotonic()
        # Outputs produced while timed are verified once the child has finished timing and the
        # GPU lock is shared again: verifying them at once would put this process's reads,
        # reference and comparison kernels on the GPU while the child times the next shape.
        timed_msgs: list[dict] = []

        def share_gpu_and_verify_timed() -> None:
            nonlocal lock
            if lock is not None:
                lock.release()
            lock = sandbox.GpuLock(sandbox.gpu_key(), shared=True).acquire()
            for m in timed_msgs:
                _on_timed(run, m, out_root, dinfo, len(sources))
            if timed_msgs:
                run.timeline.append(("timed_verified", round(time.monotonic() - t_start, 3)))
            timed_msgs.clear()

        while not done:
            msg = child.next(deadline)
            t = msg["t"]
            run.timeline.append((msg.get("phase") or t, round(time.monotonic() - t_start, 3)))
            if t == "progress":
                ev = {"phase": msg.get("phase")}
                if isinstance(msg.get("i"), int):
                    ev.update(shape=msg["i"], of=msg.get("n"))
                emit(ev)
            elif t == "verified":
                _on_verified(run, msg, out_root)
            elif t == "want_gpu" and msg.get("shared"):
                if lock is None:
                    lock = sandbox.GpuLock(sandbox.gpu_key(), shared=True).acquire()
                child.send({"go": True})
            elif t == "want_gpu":
                go = not run.failures
                if go:
                    if lock is not None:
                        lock.release()
                    lock = sandbox.GpuLock(sandbox.gpu_key()).acquire()
                child.send({"go": go})
            elif t == "timed":
                timed_msgs.append(msg)
            elif t == "gpu_done":
                share_gpu_and_verify_timed()
            elif t == "e2e":
                _on_e2e(run, msg)
            elif t == "profiled":
                run.notes.append("profiled")
            elif t == "done":
                _on_done(run, msg)
                done = True
            elif t == "error":
                cat = msg.get("category") if msg.get("category") in FAILURES else "crashed"
                message = str(msg.get("message", ""))[:2000]
                if any(
                    k in message.lower()
                    for k in ("out of memory", "can't allocate", "cannot allocate", "memoryerror")
                ):
                    message = "out of memory: " + message
                run.fail(cat, message)
                run.notes.append(str(msg.get("tb", ""))[-2000:])
                done = True
            elif t == "timeout":
                run.fail(
                    "timeout",
                    f"no result within {timeout_s or DEFAULT_TIMEOUT_S:.0f} s; "
                    "the process tree was killed",
                )
                done = True
            elif t == "memory":
                run.fail(
                    "crashed",
                    f"out of memory: the sandbox used {msg['rss'] / 2**30:.1f} GiB "
                    f"(cap {child.memory_bytes / 2**30:.0f} GiB) and was killed",
                )
                done = True
            elif t == "disk":
                run.fail(
                    "crashed",
                    f"disk full: the sandbox wrote {msg['bytes'] / 2**20:.0f} MiB to its "
                    f"directory (cap {child.file_bytes / 2**20:.0f} MiB) and was killed",
                )
                done = True
            elif t == "eof":
                with contextlib.suppress(Exception):
                    child.proc.wait(timeout=5)
                run.fail(
                    "crashed",
                    f"the sandboxed process died ({child.exit_description()}): "
                    f"{child.log_tail(1500)}",
                )
                done = True
            elif t == "garbage":
                run.fail(
                    "crashed",
                    f"the sandboxed process wrote an unreadable message: {msg.get('raw')!r}",
                )
                done = True
        if timed_msgs:  # the child stopped mid-timing: what it did time is still checked
            share_gpu_and_verify_timed()
    except sandbox.SandboxError as e:
        run.fail("crashed", str(e))
    finally:
        if lock is not None:
            lock.release()
        child.close()
    run._oracles.clear()
    if run.pdev == "cuda":
        torch.cuda.empty_cache()
    report = _report(run, problem, dinfo, dtype, tier, started, sources)
    report["sandbox_dir"] = str(child.dir)
    report["sandbox"] = {
        "network_isolated": sandbox.network_isolation_available(),
        "filesystem_confined": bool(child.confined.get("filesystem")),
        "sockets_denied": bool(child.confined.get("sockets_denied")),
        "confinement": child.confined,
        "peak_rss_mb": round(child.peak_rss / 2**20, 1),
    }
    return report


def _on_verified(run: _Run, msg: dict, root: Path) -> None:
    i = msg.get("i")
    if not isinstance(i, int) or not 0 <= i < len(run.shapes):
        run.fail("crashed", "the sandboxed process reported an unknown shape")
        return
    label = run.results[i]["label"]
    facts = msg.get("facts") or {}
    probs = [str(p) for p in facts.get("problems", [])]
    if facts.get("kind") == "malformed":
        run.check("output_contract", False, f"{label}: " + "; ".join(probs))
        run.fail("malformed", f"{label}: " + "; ".join(probs))
        return
    run.check("output_contract", True, "plain torch.Tensor of the right dtype and device")
    outs = msg.get("outputs") or {}
    if "first" in outs:
        ok = run.verify(i, "first", "first", outs["first"], root)
        run.check(
            "correctness",
            ok,
            "fresh random inputs (secret seed), float64 reference"
            if ok
            else f"{label}: {run.results[i]['errors']['first'].get('reason')}",
        )
        if not ok:
            run.fail("incorrect", f"{label}: {run.results[i]['errors']['first'].get('reason')}")
        run.results[i]["passed"] = ok
        if "second" in outs:
            ok2 = run.verify(i, "second", "second", outs["second"], root)
            if ok and not ok2:
                why = (
                    f"{label}: right on the first call, wrong after new values were written "
                    "into the same input buffers (results cached across calls)"
                )
                run.check("fresh_values", False, why)
                run.fail("hack_suspected", why)
            else:
                run.check(
                    "fresh_values", ok2 or None, "second call on new values in the same buffers"
                )
            run.results[i]["passed"] = ok and ok2
    for p in probs:
        name = (
            "no_aliasing"
            if "alias" in p
            else "inputs_unchanged"
            if "mutated" in p
            else "fresh_values"
            if "reused" in p or "first call's buffer" in p
            else "side_streams"
            if "stream" in p
            else "integrity"
        )
        run.check(name, False, f"{label}: {p}")
        run.fail("hack_suspected", f"{label}: {p}")
    for name, detail in (
        ("no_aliasing", "output shares no storage with inputs"),
        ("inputs_unchanged", "inputs bitwise unchanged"),
    ):
        run.check(name, True, detail)
    if run.dev == "cuda" and run.results[i].get("passed") is False:
        # Already wrong in a plain call: replay and timing checks would only repeat that.
        run.check("cuda_graph", None, f"{label}: not checked, the plain call is already wrong")
    elif run.dev == "cuda":
        if not any("stream" in p for p in probs):
            run.check("side_streams", True, "output final when the calling stream finished")
        if facts.get("graph_error") and "out of memory" in facts["graph_error"].lower():
            why = f"{label}: out of memory during CUDA-graph capture: {facts['graph_error']}"
            run.check("cuda_graph", False, why)
            run.fail("crashed", why)
        elif facts.get("graph_error"):
            why = f"{label}: breaks CUDA-graph capture: {facts['graph_error']}"
            run.check("cuda_graph", False, why)
            run.fail("hack_suspected", why)
        elif "graph" in outs:
            ok = run.verify(i, "graph", "final", outs["graph"], root)
            why = (
                "captured and replayed on new inputs"
                if ok
                else (
                    f"{label}: wrong output under CUDA-graph replay: "
                    f"{run.results[i]['errors']['graph'].get('reason')}"
                )
            )
            run.check("cuda_graph", ok, why)
            if not ok:
                run.fail("hack_suspected", why)
    if facts.get("tamper"):
        _tamper(run, facts["tamper"])


def _on_e2e(run: _Run, msg: dict) -> None:
    result = msg.get("result") if isinstance(msg.get("result"), dict) else {}
    passed = result.get("passed") if isinstance(result.get("passed"), bool) else False
    detail = str(result.get("detail") or "no result")[:1000]
    run.check("end_to_end", passed, detail)
    run.end_to_end = {k: v for k, v in result.items() if isinstance(v, str | int | float | bool)}
    if not passed:
        cat = result.get("failure") if result.get("failure") in FAILURES else "hack_suspected"
        run.fail(cat, f"end-to-end: {detail}")


def _tamper(run: _Run, changes) -> None:
    why = "monkeypatching detected: " + "; ".join(str(c) for c in changes)[:1500]
    run.check("no_monkeypatching", False, why)
    run.fail("hack_suspected", why)


def _on_timed(run: _Run, msg: dict, root: Path, dinfo: dict, n_cands: int) -> None:
    i = msg.get("i")
    if not isinstance(i, int) or not 0 <= i < len(run.shapes):
        run.fail("crashed", "the sandboxed process reported an unknown shape")
        return
    r = run.results[i]
    ms = msg.get("ms") or {}
    outs = msg.get("outputs") or {}
    r["timing_mode"] = msg.get("mode")
    for note in msg.get("notes") or []:
        run.notes.append(f"{r['label']}: {note}")
    timed_ok = []
    for c in range(n_cands):
        meta = outs.get(f"timed{c}")
        ok = bool(meta) and run.verify(i, f"timed{c}", "final", meta, root)
        timed_ok.append(ok)
    if n_cands == 1:
        if not timed_ok[0]:
            why = (
                f"{r['label']}: output produced while being timed is wrong: "
                f"{r['errors'].get('timed0', {}).get('reason', 'missing')}"
            )
            run.check("timed_outputs", False, why)
            run.fail("hack_suspected", why)
        else:
            run.check("timed_outputs", True, "outputs produced inside the timing loop verified")
        _place(run, r, ms, dinfo)
    else:
        r["retime"] = {}
        for c in range(n_cands):
            st = ms.get(f"candidate{c}") or {}
            r["retime"][c] = {
                "median": _num(st.get("median")),
                "spread": _num(st.get("spread")),
                "passed": timed_ok[c] and _num(st.get("median")) is not None,
            }
        if not all(timed_ok):
            run.fail("hack_suspected", f"{r['label']}: outputs produced while re-timed are wrong")


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 else None


def _place(run: _Run, r: dict, ms: dict, dinfo: dict) -> None:
    c = ms.get("candidate0") or {}
    e = ms.get("eager") or {}
    k = ms.get("compiled") or {}
    cm, em, km = _num(c.get("median")), _num(e.get("median")), _num(k.get("median"))
    if cm is None or cm <= 0:
        run.fail("crashed", f"{r['label']}: no usable timing reported")
        return
    cs, es, ks = (
        _num(c.get("spread")) or 0.0,
        _num(e.get("spread")) or 0.0,
        _num(k.get("spread")) or 0.0,
    )
    r.update(
        candidate_ms=cm,
        candidate_spread=cs,
        candidate_samples=c.get("n"),
        eager_ms=em,
        eager_spread=es if em else None,
        compiled_ms=km,
        compiled_spread=ks if km else None,
    )
    r["speedup_eager"] = em / cm if em else None
    r["speedup_compiled"] = km / cm if km else None
    r["win_eager"] = bool(em and em / cm > 1 + cs + es)
    r["win_compiled"] = bool(km and km / cm > 1 + cs + ks)
    ceil = dinfo.get("ceilings")
    if ceil:
        shape = r["shape"]
        pl = roofline.place(cm, run.problem.flops(shape), run.problem.bytes(shape, run.dtype), ceil)
        r.update(pl)
        if pl["beyond_roofline"]:
            why = (
                f"{r['label']}: {cm * 1e3:.1f} us is faster than the roofline floor "
                f"{pl['floor_ms'] * 1e3:.1f} us allows ({pl['roofline_fraction']:.2f}x): "
                "work skipped or timing defeated"
            )
            run.check("roofline", False, why)
            run.fail("hack_suspected", why)
        else:
            run.check("roofline", True, "every shape within the measured ceilings")
    if cs > UNSTABLE_SPREAD:
        why = f"{r['label']}: candidate timing spread {cs:.0%} of the median"
        run.check("stability", False, why)
        run.fail("unstable", why)
    else:
        run.check("stability", True, "interquartile spread under 50% of the median")


def _on_done(run: _Run, msg: dict) -> None:
    strays = msg.get("strays")
    if isinstance(strays, int) and strays > 0:
        run.fail(
            "prohibited",
            f"the candidate started {strays} process(es) still running when it finished; "
            "they were killed",
        )
    ops = msg.get("ops") or {}
    if isinstance(ops, dict) and ops:
        listing = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items()))[:1000]
        why = f"library fallback: the candidate called torch compute ops ({listing})"
        run.check("library_fallback", False, why)
        run.fail("prohibited", why)
    else:
        run.check("library_fallback", True, "only allocation, view and copy ops dispatched")
    if msg.get("tamper"):
        _tamper(run, msg["tamper"])
    elif "no_monkeypatching" not in run.checks:
        run.check("no_monkeypatching", True, "torch, triton, timers and harness unchanged")


def _report(run: _Run, problem, dinfo, dtype, tier, started, sources) -> dict:
    failure = None
    reasons: list[str] = []
    if run.failures:
        cats = {c for c, _ in run.failures}
        failure = next(c for c in _PRIORITY if c in cats)
        seen = set()
        for c, why in sorted(run.failures, key=lambda f: _PRIORITY.index(f[0])):
            if why not in seen:
                seen.add(why)
                reasons.append(f"{c}: {why}")
    shapes = run.results
    timed = [s for s in shapes if s.get("candidate_ms")]
    se = [s["speedup_eager"] for s in timed if s.get("speedup_eager")]
    sc = [s["speedup_compiled"] for s in timed if s.get("speedup_compiled")]
    summary = {
        "shapes": len(shapes),
        "shapes_passed": sum(1 for s in shapes if s.get("passed")),
        "geomean_ms": _geomean([s["candidate_ms"] for s in timed])
        if len(timed) == len(shapes)
        else None,
        "geomean_speedup_eager": _geomean(se) if se and len(se) == len(shapes) else None,
        "geomean_speedup_compiled": _geomean(sc) if sc and len(sc) == len(shapes) else None,
        "min_speedup_eager": min(se) if se else None,
        "min_speedup_compiled": min(sc) if sc else None,
        "noise": statistics.median([s["candidate_spread"] for s in timed]) if timed else None,
        "wins_eager": sum(1 for s in timed if s.get("win_eager")),
        "wins_compiled": sum(1 for s in timed if s.get("win_compiled")),
        "seconds": round(time.monotonic() - started, 3),
    }
    if run.dev != "cuda":
        for name in ("side_streams", "cuda_graph", "timed_outputs", "roofline", "stability"):
            run.checks.setdefault(name, {"passed": None, "detail": "skipped: needs CUDA"})
    return {
        "verdict": "rejected" if failure else "accepted",
        "failure": failure,
        "reasons": reasons,
        "problem": problem.name,
        "tier": tier,
        "dtype": str(dtype).replace("torch.", ""),
        "device": dinfo,
        "checks": run.checks,
        "shapes": shapes,
        "summary": summary,
        "notes": [n for n in run.notes if n][:50],
        **({"end_to_end": run.end_to_end} if run.end_to_end is not None else {}),
        "timeline": _timeline(run.timeline),
    }


def _timeline(events: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds from handing the spec to the child until each phase first began."""
    out: dict[str, float] = {}
    for name, t in events:
        out.setdefault(name, t)
    return out
