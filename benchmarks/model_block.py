"""The model block end to end: a Llama-style decoder block (kernels/block.py) with every op called
through the release library (`kernels.library.load`), against the same block eager and under
torch.compile, at prefill and decode shapes, with the ops that ran a released kernel listed.

    python benchmarks/model_block.py [--library DIR] [--json OUT] [--budget S] [--no-compile]
    python benchmarks/model_block.py --smoke [--library DIR] [--json OUT]

On a GPU (the default where CUDA is present): bf16, hidden 4096, 32 heads of 128, MLP 11008 (a
Llama-2-7B block, multi-head attention); prefill of batch x sequence 1x512 to 1x8192 and 8x1024,
timed call by call with CUDA events; decode of one new token per sequence against a KV cache of
1024 to 8192 positions at batch 1 and 8, each variant captured in a CUDA graph and timed by
replay. The variants (released: the block's ops called through the library; eager;
torch.compile of the eager block; released+compile: torch.compile of the released block, how a
user compiles a model that calls the library, which by default traces the references there;
kernels+compile: the same with the library told to run its releases under torch.compile too,
`load(..., under_compile="kernel")`) are sampled in shuffled order round after round in one
process (kernels.harness.timing), medians reported with their spread; speedups are eager /
variant and compiled / variant.

`--smoke` runs on the CPU: tiny shapes, float32, releases of kind `interpret` in Triton's
interpreter (TRITON_INTERPRET=1 is set). It checks that the variants agree and reports
which op ran what; it times nothing, so it makes no speed claim.

The breakdown lists each distinct op call of the block (op and shape) with what ran it: a
release (its id), the reference (no release for this GPU kind, dtype or shape: the reason is
given) or torch (no problem covers the op: decode attention against a cache). On a GPU each
breakdown row is also timed alone, the release against the reference, each in a CUDA graph.

The library directory comes from --library or AUTOWEB_LIBRARY_DIR; without one every op runs
its reference. The exit code is 1 when a variant's output is off the eager block's by more than
the end-to-end tolerance (kernels.harness.e2e.TOLERANCE).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPU_MODEL = {"hidden": 4096, "heads": 32, "mlp": 11008}
SMOKE_MODEL = {"hidden": 64, "heads": 2, "mlp": 96}
# (batch, sequence) for prefill; (batch, cache length) for decode.
GPU_PREFILL = [(1, 512), (1, 2048), (4, 2048), (1, 8192), (8, 1024)]
GPU_DECODE = [(1, 1024), (1, 8192), (8, 2048), (8, 8192)]
SMOKE_PREFILL = [(2, 7)]
SMOKE_DECODE = [(2, 9)]
VARIANTS = ("released", "eager", "compiled", "released_compiled", "kernels_compiled")


def library_ops(library_dir: str | None, under_compile: str | None = None) -> dict[str, Any]:
    """Every op of the block through the library; ops no problem covers stay torch calls."""
    from kernels import block, library

    ops: dict[str, Any] = {
        name: library.load(name, library_dir, under_compile=under_compile) for name in block.OPS
    }
    for name in block.TORCH_OPS:
        ops[name] = block.reference_ops()[name]
    return ops


def _describe(args: tuple) -> str:
    return " ".join("x".join(str(d) for d in a.shape) for a in args)


def _why_fallback(kernel: Any, args: tuple) -> str:
    """Why the library runs the reference for these inputs (its choice returned None)."""
    import torch

    from kernels import library

    if not kernel.releases:
        return f"no release of {kernel.problem}"
    device = args[0].device
    if device.type == "cuda":
        kind = library.gpu_kind(torch.cuda.get_device_name(device))
    elif os.environ.get("TRITON_INTERPRET") == "1":
        kind = library.INTERPRET
    else:
        return "a CPU without the Triton interpreter"
    dtype = str(args[0].dtype).replace("torch.", "")
    ours = [r for r in kernel.releases if r["kind"] == kind]
    if not ours:
        return f"no release for {kind}"
    ours = [r for r in ours if r.get("dtype", dtype) == dtype]
    if not ours:
        return f"no release for {dtype} on {kind}"
    if not all(a.is_contiguous() for a in args) or (
        kernel.ranks and [a.dim() for a in args] != list(kernel.ranks)
    ):
        return "inputs unlike the validated ones (layout or rank)"
    shape = kernel.shape_of(args) or {}
    ranges = "; ".join(
        ",".join(f"{d}={lo}..{hi}" for d, (lo, hi) in r["shape_range"].items()) for r in ours
    )
    label = ",".join(f"{d}={v}" for d, v in shape.items())
    return f"{label} outside every released range ({ranges})"


def breakdown(run_block, ops: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the block once with `ops` wrapped, and list each distinct (op, input shapes) call
    with what ran it. Each row keeps the first call's inputs (under "_args") for timing."""
    from kernels import library

    rows: dict[tuple, dict[str, Any]] = {}

    def wrap(name: str, fn: Any):
        def call(*args):
            key = (name, tuple(tuple(a.shape) for a in args))
            row = rows.get(key)
            if row is None:
                row = rows[key] = {"op": name, "inputs": _describe(args), "calls": 0}
                if isinstance(fn, library.Kernel):
                    choice = fn.choose(*args)
                    row["shape"] = fn.shape_of(args)
                    if choice is not None:
                        row["ran"] = f"release #{choice['id']}"
                        row["release"] = {
                            k: choice.get(k) for k in ("id", "kind", "dtype", "speedup_eager")
                        }
                    else:
                        row["ran"] = "reference"
                        row["why"] = _why_fallback(fn, args)
                else:
                    row["ran"] = "torch"
                    row["why"] = "no problem covers this op"
                row["_args"] = args
                row["_fn"] = fn
            row["calls"] += 1
            return fn(*args)

        return call

    run_block({name: wrap(name, fn) for name, fn in ops.items()})
    return list(rows.values())


def _event_sampler(fn):
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def sample():
        start.record()
        fn()
        end.record()
        return start, end

    return sample


def time_variants(fns: dict[str, Any], *, graph: bool, budget_s: float, seed: int) -> dict:
    """Median ms and spread of each variant, sampled interleaved; an error instead of numbers
    for a variant that cannot be captured or run."""
    import torch

    from kernels.harness import timing

    samplers, errors = {}, {}
    for name, fn in fns.items():
        try:
            if graph:
                g, _ = timing.capture([fn], reps=1)
                samplers[name] = timing.graph_sampler(g)
            else:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                samplers[name] = _event_sampler(fn)
        except Exception as e:  # e.g. an op that cannot be captured in a CUDA graph
            torch.cuda.synchronize()
            errors[name] = f"{type(e).__name__}: {e}"[:300]
    stats = (
        timing.interleaved(
            samplers,
            per_call_divisor={n: 1 for n in samplers},
            budget_s=budget_s,
            rng=random.Random(seed),
        )
        if samplers
        else {}
    )
    out = {n: {"ms": s["median"], "spread": s.get("spread")} for n, s in stats.items()}
    out.update({n: {"error": e} for n, e in errors.items()})
    return out


def time_ops(rows: list[dict[str, Any]], budget_s: float, seed: int) -> None:
    """Each breakdown row alone: its reference, and its release where one ran, in CUDA graphs."""
    from kernels import library

    for i, row in enumerate(rows):
        fn, args = row["_fn"], row["_args"]
        fns = {}
        if isinstance(fn, library.Kernel):
            fns["reference"] = partial(fn.reference, *args)
            if row.get("release"):
                fns["release"] = partial(fn, *args)
        else:
            fns["torch"] = partial(fn, *args)
        timed = time_variants(fns, graph=True, budget_s=budget_s, seed=seed + i)
        row["timing"] = timed
        ref = timed.get("reference", {}).get("ms")
        rel = timed.get("release", {}).get("ms")
        row["speedup"] = ref / rel if ref and rel else None


def run_case(
    phase: str, batch: int, seq: int, args, lib_ops, kernel_ops, dtype, device
) -> dict[str, Any]:
    """One shape: the variants' outputs compared, timed on a GPU, and the breakdown."""
    import torch

    from kernels import block
    from kernels.harness import e2e

    cfg = block.Config(batch=batch, seq=seq, **(SMOKE_MODEL if args.smoke else GPU_MODEL))
    w = block.make_weights(cfg, dtype, device, seed=args.seed)
    ref_ops = block.reference_ops()
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 1)
    tokens = 1 if phase == "decode" else seq
    x = torch.randn(batch, tokens, cfg.hidden, device=device, generator=gen).to(dtype)
    cache = block.make_cache(cfg, dtype, device, seed=args.seed + 2) if phase == "decode" else {}

    def forward(ops):  # decode: on its own copy of the cache, of which it writes one slot
        if phase == "decode":
            own = {k: t.clone() for k, t in cache.items()}
            return partial(block.decode, cfg, w, x, own, ops)
        return partial(block.prefill, cfg, w, x, ops)

    fns = {"released": forward(lib_ops), "eager": forward(ref_ops)}
    if not args.no_compile:
        torch._dynamo.reset()  # each shape compiles its own block; no cache limit reached
        fns["compiled"] = torch.compile(forward(ref_ops), dynamic=False)
        # How a user runs a model with the library: torch.compile over the block whose ops
        # call it. By default the library traces each op's reference there, so this is
        # torch.compile's own block; kernels+compile runs the releases inside it (Inductor
        # fuses the glue and the ops with no release around them). Not on the CPU: there the
        # releases run in Triton's interpreter, which torch.compile cannot trace.
        fns["released_compiled"] = torch.compile(forward(lib_ops), dynamic=False)
        if device == "cuda":
            fns["kernels_compiled"] = torch.compile(forward(kernel_ops), dynamic=False)
    rows = breakdown(lambda ops: forward(ops)(), lib_ops)
    outputs, failed = {}, {}
    for name, fn in fns.items():
        try:
            outputs[name] = fn()
        except Exception as e:  # a variant that does not run is reported, not hidden
            failed[name] = f"{type(e).__name__}: {e}"[:300]
    tol = e2e.TOLERANCE.get(dtype, 3e-2)
    checks: dict[str, Any] = {}
    for name in fns:
        if name in failed:
            checks[name] = {"ok": False, "error": failed[name]}
        elif name != "eager" and "eager" in outputs:
            err = e2e.rel_l2(outputs[name], outputs["eager"])
            checks[name] = {"ok": err <= tol, "rel_l2_vs_eager": err}
    result: dict[str, Any] = {
        "phase": phase,
        "batch": batch,
        "seq": seq,
        "block": cfg.label(),
        "tolerance": tol,
        "checks": checks,
        "ok": all(c["ok"] for c in checks.values()),
    }
    if device == "cuda":
        ok_fns = {n: f for n, f in fns.items() if n not in failed}
        timed = time_variants(ok_fns, graph=phase == "decode", budget_s=args.budget, seed=args.seed)
        result["timing"] = timed
        ms = {n: t.get("ms") for n, t in timed.items()}
        released = ms.get("released")
        result["released_ms"] = released
        for base in ("eager", "compiled"):
            result[f"{base}_ms"] = ms.get(base)
            result[f"speedup_{base}"] = ms[base] / released if released and ms.get(base) else None
        for variant in ("released_compiled", "kernels_compiled"):
            vm = ms.get(variant)
            result[f"{variant}_ms"] = vm
            for base in ("eager", "compiled"):
                result[f"{variant}_speedup_{base}"] = ms[base] / vm if vm and ms.get(base) else None
        if not args.no_op_timing:
            time_ops(rows, args.op_budget, args.seed)
    result["ops"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    result["released_ops"] = sum(1 for r in rows if r["ran"].startswith("release"))
    return result


def _f(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def print_report(report: dict[str, Any]) -> None:
    lib = report["library"]
    held = ", ".join(f"{p} {n}" for p, n in lib["releases"].items()) or "no releases"
    print(
        f"model block ({report['model']}), {report['dtype']} on {report['device']['name']} "
        f"({report['device']['kind']}); library: {lib['dir'] or 'none'} ({held})"
    )
    if report["mode"] == "smoke":
        print("smoke run on the CPU: outputs checked, nothing timed (no speed claim)")
    print(
        f"{'phase':8s} {'B':>3s} {'S':>6s} {'eager ms':>9s} {'compile ms':>10s} "
        f"{'released ms':>11s} {'x eager':>8s} {'x compile':>9s} {'rel+compile ms':>14s} "
        f"{'x compile':>9s} {'kern+compile ms':>15s} {'x compile':>9s} {'released ops':>12s}  ok"
    )
    for r in report["runs"]:
        print(
            f"{r['phase']:8s} {r['batch']:>3d} {r['seq']:>6d} {_f(r.get('eager_ms')):>9s} "
            f"{_f(r.get('compiled_ms')):>10s} {_f(r.get('released_ms')):>11s} "
            f"{_f(r.get('speedup_eager'), '.2f'):>8s} {_f(r.get('speedup_compiled'), '.2f'):>9s} "
            f"{_f(r.get('released_compiled_ms')):>14s} "
            f"{_f(r.get('released_compiled_speedup_compiled'), '.2f'):>9s} "
            f"{_f(r.get('kernels_compiled_ms')):>15s} "
            f"{_f(r.get('kernels_compiled_speedup_compiled'), '.2f'):>9s} "
            f"{r['released_ops']:>5d} of {len(r['ops']):<4d}  {'yes' if r['ok'] else 'NO'}"
        )
        for name, c in r["checks"].items():
            if not c["ok"]:
                why = c.get("error") or f"rel. L2 {c['rel_l2_vs_eager']:.3g} vs eager"
                print(f"    {name}: {why} (tolerance {r['tolerance']:g})")
    for r in report["runs"]:
        print(f"\nops of {r['phase']} B={r['batch']} S={r['seq']}:")
        for op in r["ops"]:
            line = f"  {op['op']:16s} {op['inputs']:32s} x{op['calls']:<2d} {op['ran']:12s}"
            t = op.get("timing")
            if t is not None:
                ref = (t.get("reference") or t.get("torch") or {}).get("ms")
                rel = (t.get("release") or {}).get("ms")
                line += (
                    f" ref {_f(ref, '.4f'):>8s} ms  release {_f(rel, '.4f'):>8s} ms "
                    f"{_f(op.get('speedup'), '.2f'):>5s}x"
                )
            print(f"{line}  {op.get('why', '')}".rstrip())


def _cases(args, ap) -> list[tuple[str, int, int]]:
    if args.cases:
        out = []
        for text in args.cases:
            phase, _, size = text.partition(":")
            b, _, seq = size.partition("x")
            if phase not in ("prefill", "decode") or not (b.isdigit() and seq.isdigit()):
                ap.error(f"--cases: {text!r} is not PHASE:BxS, e.g. prefill:1x512")
            if int(b) < 1 or int(seq) < 1:
                ap.error(f"--cases: {text!r}: sizes start at 1")
            out.append((phase, int(b), int(seq)))
        return out
    shapes = {
        "prefill": SMOKE_PREFILL if args.smoke else GPU_PREFILL,
        "decode": SMOKE_DECODE if args.smoke else GPU_DECODE,
    }
    return [(p, b, s) for p in ("prefill", "decode") if p in args.phases for b, s in shapes[p]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, no timing")
    ap.add_argument("--library", help="library directory (default: AUTOWEB_LIBRARY_DIR)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--phases", nargs="+", default=["prefill", "decode"])
    ap.add_argument(
        "--cases",
        nargs="+",
        metavar="PHASE:BxS",
        help="run only these shapes, e.g. prefill:1x512 decode:8x8192 (S: the cache for decode)",
    )
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per shape")
    ap.add_argument("--op-budget", type=float, default=0.3, help="seconds per op timing")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    ap.add_argument("--no-op-timing", action="store_true", help="skip timing ops alone")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    bad = sorted(set(args.phases) - {"prefill", "decode"})
    if bad:
        ap.error(f"unknown phase {bad[0]!r}: prefill, decode")
    cases = _cases(args, ap)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the CPU's "GPU kind"

    import torch

    from kernels import library
    from kernels.harness import device as devmod

    if not args.smoke and not torch.cuda.is_available():
        print("error: the benchmark needs a CUDA GPU; --smoke runs on the CPU", file=sys.stderr)
        return 2
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    lib_dir = args.library or os.environ.get(library.ENV_DIR) or None
    try:
        lib_ops = library_ops(lib_dir)
        kernel_ops = library_ops(lib_dir, "kernel")
    except library.LibraryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    held = {
        name: len(k.releases)
        for name, k in lib_ops.items()
        if isinstance(k, library.Kernel) and k.releases
    }
    started = time.time()
    with torch.no_grad():
        runs = [
            run_case(phase, b, s, args, lib_ops, kernel_ops, dtype, device) for phase, b, s in cases
        ]
    report = {
        "command": " ".join(["python", "benchmarks/model_block.py", *(argv or sys.argv[1:])]),
        "mode": "smoke" if args.smoke else "gpu",
        "device": devmod.info("interpret" if args.smoke else "cuda", measure_ceilings=False),
        "python": platform.python_version(),
        "dtype": str(dtype).replace("torch.", ""),
        "model": ", ".join(
            f"{k} {v}" for k, v in (SMOKE_MODEL if args.smoke else GPU_MODEL).items()
        ),
        "library": {"dir": lib_dir, "releases": held},
        "runs": runs,
        "seconds": round(time.time() - started, 1),
    }
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
