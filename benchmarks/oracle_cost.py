"""What the caller's float64 references cost per shape: the eager oracle against the oracle
compiled as the harness compiles it (docs/harness.md, Measurement: torch.compile with dynamic
shapes, the upcast to float64 inside the graph), on one problem's full sweep, alone on the GPU.

Per shape: the milliseconds of making the inputs, of the eager oracle (warm allocator, and
`cold` after emptying it, as the caller does after each check), of the compiled oracle (the
same two ways), of the problem's reference in its own precision, and the GPU memory each oracle
took at its peak beyond its inputs; the first call's seconds (the compile, where one happened),
and how far the two oracles are apart. Best of three each, CUDA synchronised.

    python3 benchmarks/oracle_cost.py --problems-dir benchmarks/user_problems \
        --problem token_logprobs --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", required=True)
    ap.add_argument("--problems-dir", action="append", default=[])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)

    import torch

    from kernels import problems
    from kernels.harness.oracle import compile_oracle

    if not torch.cuda.is_available():
        print("oracle_cost.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    p = problems.load(args.problem, args.problems_dir)
    dtype = p.dtype("cuda")
    compiled = compile_oracle(p)

    def ms(work, cold: bool = False) -> float:
        best = float("inf")
        for _ in range(3):
            if cold:
                torch.cuda.empty_cache()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            work()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    def peak_gb(work) -> float:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        work()
        return (torch.cuda.max_memory_allocated() - base) / 2**30

    def measure(shape: dict) -> dict:
        inputs = p.make_inputs(shape, dtype, "cuda", 1)
        row: dict = {"shape": shape}
        row["make_inputs_ms"] = ms(lambda: p.make_inputs(shape, dtype, "cuda", 2))
        row["eager_ms"] = ms(lambda: p.oracle(*inputs))
        row["eager_cold_ms"] = ms(lambda: p.oracle(*inputs), cold=True)
        row["eager_peak_gb"] = peak_gb(lambda: p.oracle(*inputs))
        t0 = time.perf_counter()
        compiled(*inputs)
        torch.cuda.synchronize()
        row["compile_first_s"] = time.perf_counter() - t0
        row["compiled_ms"] = ms(lambda: compiled(*inputs))
        row["compiled_cold_ms"] = ms(lambda: compiled(*inputs), cold=True)
        row["compiled_peak_gb"] = peak_gb(lambda: compiled(*inputs))
        eager, fast = p.oracle(*inputs), compiled(*inputs)
        row["max_abs_diff"] = (fast - eager).abs().max().item()
        row["max_rel"] = ((fast - eager).abs() / eager.abs().clamp_min(1e-300)).max().item()
        row["own_precision_ms"] = ms(lambda: p.module.reference(*inputs))
        return row

    rows = []
    with torch.no_grad():
        for shape in p.shapes("full"):
            rows.append(measure(shape))
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    keys = ("make_inputs_ms", "eager_ms", "eager_cold_ms", "compiled_ms", "compiled_cold_ms")
    total = {k: round(sum(r[k] for r in rows), 3) for k in (*keys, "own_precision_ms")}
    print("per sweep:", json.dumps(total))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "per_sweep": total}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
