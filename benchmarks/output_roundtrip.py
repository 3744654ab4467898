"""What one candidate output costs on its way from the sandboxed child to the verdict.

    python benchmarks/output_roundtrip.py [--device auto|cuda|cpu] [--mib 64,512] [--repeats 5]
                                          [--json OUT]

Every shape's outputs go through a file (three per shape while verifying, one per candidate
when timed): the child writes each with `childrun.write_tensor`, the caller reads it with
`verdict._read_raw`, hashes the ones it may meet again (the CUDA-graph output and the timed
outputs after it) and copies it to the device to compare it with the reference. This times
those steps, the same functions the harness runs, on bf16 outputs of the given sizes, and
prints the median of `--repeats` per step. The comparison itself is not included (see
tests/kernels/test_compare.py for what it checks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--mib", default="64,512", help="output sizes in MiB, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.mib.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--mib takes whole numbers of MiB, got {args.mib!r}")
    if not sizes or min(sizes) < 1:
        ap.error("--mib needs at least one size of 1 MiB or more")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")

    import torch

    from kernels.harness import device as devinfo
    from kernels.harness import verdict
    from kernels.harness.childrun import write_tensor
    from kernels.harness.sandbox import _scratch_root

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    # Where the harness puts a sandbox's directory, and so its output files.
    root = Path(tempfile.mkdtemp(prefix="autoweb-roundtrip-", dir=_scratch_root()))
    rows = []
    for mib in sizes:
        out = torch.randn(mib * 2**19, dtype=torch.bfloat16, device=device).reshape(-1, 4096)
        steps: dict[str, list[float]] = {"write": [], "read": [], "sha256": [], "to_device": []}
        for _ in range(args.repeats):
            sync()
            t0 = time.perf_counter()
            meta = write_tensor(out, root, "first")
            t1 = time.perf_counter()
            raw, shape = verdict._read_raw(meta, torch.bfloat16, root, list(out.shape))
            t2 = time.perf_counter()
            hashlib.sha256(raw).hexdigest()
            t3 = time.perf_counter()
            back = verdict._tensor(raw, shape, torch.bfloat16).to(device)
            sync()
            t4 = time.perf_counter()
            if not torch.equal(back, out):
                raise SystemExit("the output read back differs from the one written")
            Path(meta["file"]).unlink()
            del raw, back
            for name, s in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[name].append(s)
        med = {k: statistics.median(v) for k, v in steps.items()}
        rows.append({"mib": mib, **{f"{k}_s": round(v, 4) for k, v in med.items()}})
        print(
            f"{mib:>5} MiB  write {med['write']:.3f} s  read {med['read']:.3f} s  "
            f"sha256 {med['sha256']:.3f} s  to {device} {med['to_device']:.3f} s"
        )
    root.rmdir()
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else _cpu_name(),
        "versions": devinfo.versions(),
        "repeats": args.repeats,
        "scratch": str(root.parent),
        "rows": rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":
    raise SystemExit(main())
