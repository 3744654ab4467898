"""Dispatch overhead of kernels.library per call: what `load(problem)(*inputs)` costs on top of
calling the chosen function directly. Target: under 5 us per call on the H200.

    python benchmarks/library_dispatch.py [--device auto|cuda|cpu] [--calls 100000] [--json OUT]

A throwaway library is written with one release whose kernel returns its input (no launch, no
compute), valid on this machine's GPU kind (or `interpret` on the CPU), so the difference
between the two timings is the dispatcher alone: building the cache key from the inputs, one
dict lookup, one extra Python call. The fallback path (a shape outside the range, served by the
reference) is timed the same way against calling the reference directly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IDENTITY = "def kernel(x):\n    return x\n"


def _loop_us(fn, args, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter_ns() - t0) / calls / 1e3


def paired_us(direct, dispatched, args, calls: int, repeats: int) -> dict:
    """Direct and dispatched loops alternated, so a busy machine slows both alike; the
    overhead is the median of the per-pair differences."""
    for _ in range(min(calls, 1000)):
        direct(*args)
        dispatched(*args)
    pairs = [
        (_loop_us(direct, args, calls), _loop_us(dispatched, args, calls)) for _ in range(repeats)
    ]
    return {
        "direct_us": statistics.median(a for a, _ in pairs),
        "dispatched_us": statistics.median(b for _, b in pairs),
        "overhead_us": statistics.median(b - a for a, b in pairs),
        "pairs_us": pairs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # the CPU's "GPU kind" is the interpreter
        torch.set_num_threads(1)  # a shared CPU: intra-op threads only add noise here
    from kernels import library

    if device == "cuda":
        kind, dtype, name = (
            library.gpu_kind(torch.cuda.get_device_name(0)),
            torch.bfloat16,
            torch.cuda.get_device_name(0),
        )
    else:
        kind, dtype, name = library.INTERPRET, torch.float32, platform.processor() or "cpu"

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "kernels").mkdir()
        (root / "kernels" / "identity.py").write_text(IDENTITY)
        manifest = {
            "format": library.FORMAT,
            "problems": {"softmax": {"dims": {"M": [0, 0], "N": [0, 1]}, "ranks": [2]}},
            "releases": [
                {
                    "id": 1,
                    "problem": "softmax",
                    "kind": kind,
                    "dtype": str(dtype).replace("torch.", ""),
                    "shape_range": {"M": [1, 65536], "N": [1, 4096]},
                    "file": "kernels/identity.py",
                    "speedup_eager": 1.0,
                }
            ],
        }
        (root / library.MANIFEST).write_text(json.dumps(manifest))
        kernel = library.load("softmax", library_dir=root)
        x = torch.randn(4096, 4096, device=device, dtype=dtype)
        outside = torch.randn(1, 4097, device=device, dtype=dtype)  # N beyond the range
        assert kernel.choose(x) is not None and kernel.choose(outside) is None
        direct = kernel._function(kernel.choose(x))

        t0 = time.perf_counter_ns()
        fresh = library.load("softmax", library_dir=root)
        fresh(x)
        first_us = (time.perf_counter_ns() - t0) / 1e3

        release = paired_us(direct, kernel, (x,), args.calls, args.repeats)
        fallback_calls = max(1, args.calls // 10)
        fallback = paired_us(kernel.reference, kernel, (outside,), fallback_calls, args.repeats)

    result = {
        "device": device,
        "device_name": name,
        "kind": kind,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "calls": args.calls,
        "repeats": args.repeats,
        "first_call_us": first_us,
        "release": release,
        "fallback": fallback,
        "overhead_us": release["overhead_us"],
        "fallback_overhead_us": fallback["overhead_us"],
        "target_us": 5.0,
    }
    print(f"device: {name} ({kind}), torch {torch.__version__}, python {result['python']}")
    print(
        f"release path: direct {release['direct_us']:.3f} us, dispatched "
        f"{release['dispatched_us']:.3f} us -> overhead {release['overhead_us']:.3f} us"
    )
    print(
        f"fallback path: reference {fallback['direct_us']:.3f} us, dispatched "
        f"{fallback['dispatched_us']:.3f} us -> overhead {fallback['overhead_us']:.3f} us"
    )
    print(f"first call (load + choose + import): {first_us:.1f} us")
    verdict = "within" if result["overhead_us"] < result["target_us"] else "OVER"
    print(
        f"overhead_us: {result['overhead_us']:.3f} ({verdict} the {result['target_us']} us target)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
