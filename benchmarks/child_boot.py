"""What starting one sandboxed child costs, in wall seconds and CPU seconds, and where it goes.

Every evaluation runs in a fresh child (kernels.harness.sandbox.Child), which imports torch and
the rest and, on a GPU, creates its CUDA context before it says it is ready. This measures:

- `children`: `--children` real sandboxed children started one after another, each until it is
  ready: wall seconds, and CPU seconds as the caller reads them (`Child.cpu_seconds`);
- `steps`: the same start-up steps in a plain subprocess started as the sandbox starts its
  child (its interpreter flags and environment: an empty HOME and caches), CPU and wall
  seconds per step, `--repeats` times;
- `bytecode`: per top-level package, how many of the modules those steps loaded from source
  files had compiled bytecode beside them. A child writes none, so a package installed without
  it (`pip install --no-compile`) is compiled again by every child that starts;
- `imports`: one `python -X importtime` run of those steps, self time summed per top-level
  package, largest first;
- `compiled_first`: what kernels.harness.bytecode compiled before the first child started
  (the packages that came without bytecode; {} when none did).

    python benchmarks/child_boot.py --device cuda --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.harness import sandbox  # noqa: E402

STEPS = r"""
import json, os, resource, sys, time
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
out, last = {}, [cpu(), time.perf_counter()]
def mark(name):
    c, t = cpu(), time.perf_counter()
    out[name] = [round(c - last[0], 3), round(t - last[1], 3)]
    last[:] = [c, t]
mark("interpreter")
import torch; mark("torch")
import torch._dynamo; mark("torch._dynamo")
import triton, triton.language; mark("triton")
if sys.argv[1] == "cuda":
    torch.cuda.init(); mark("cuda_init")
    torch.empty(1, device="cuda"); torch.cuda.synchronize(); mark("cuda_context")
sys.path.insert(0, sys.argv[2])
from kernels.harness import childrun, compare, timing; mark("harness")
bytecode = {}
for name, mod in list(sys.modules.items()):
    cached, source = getattr(mod, "__cached__", None), getattr(mod, "__file__", None)
    if not isinstance(cached, str) or not isinstance(source, str) or not source.endswith(".py"):
        continue
    row = bytecode.setdefault(name.split(".")[0], [0, 0])
    row[0] += 1
    row[1] += os.path.exists(cached)
print("STEPS" + json.dumps({"steps": out, "bytecode": bytecode}))
"""


def _env(tmp: Path, device: str) -> dict:
    """The sandbox's own start-up environment for a child (kernels.harness.sandbox.base_env)."""
    env = sandbox.base_env(tmp)
    if device != "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def steps(device: str, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run(
                [sys.executable, *sandbox.PYTHON_FLAGS, "-c", STEPS, device, str(ROOT)],
                env=_env(Path(d), device),
                capture_output=True,
                text=True,
                timeout=300,
            )
        line = next((x for x in p.stdout.splitlines() if x.startswith("STEPS")), None)
        if line is None:
            raise SystemExit(f"the start-up steps failed: {p.stderr[-2000:]}")
        runs.append(json.loads(line[5:]))
    first = runs[0]
    return {
        "steps": {
            name: {
                "cpu_s": round(statistics.median(r["steps"][name][0] for r in runs), 3),
                "wall_s": round(statistics.median(r["steps"][name][1] for r in runs), 3),
            }
            for name in first["steps"]
        },
        # Per top-level package: modules loaded from source, and how many of them had their
        # compiled bytecode beside them (the rest were compiled again by this start).
        "bytecode": {
            k: {"modules": v[0], "with_bytecode": v[1]}
            for k, v in sorted(first["bytecode"].items(), key=lambda kv: -kv[1][0])
            if v[0] >= 5
        },
    }


def imports(device: str, top: int = 15) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(
            [sys.executable, *sandbox.PYTHON_FLAGS, "-X", "importtime", "-c", STEPS]
            + [device, str(ROOT)],
            env=_env(Path(d), device),
            capture_output=True,
            text=True,
            timeout=300,
        )
    per: dict[str, int] = {}
    for line in p.stderr.splitlines():
        # "import time: self [us] | cumulative | imported package"
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3:
            continue
        name = parts[2].strip().split(".")[0]
        per[name] = per.get(name, 0) + int(parts[0])
    ranked = sorted(per.items(), key=lambda kv: -kv[1])[:top]
    return [{"package": k, "self_s": round(v / 1e6, 3)} for k, v in ranked]


def children(device: str, n: int) -> dict:
    walls, cpus = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        child = sandbox.Child(device)
        try:
            child.wait_ready()
            walls.append(time.perf_counter() - t0)
            cpus.append(child.cpu_seconds())
        finally:
            child.close()
    return {
        "n": n,
        "wall_s": [round(x, 3) for x in walls],
        "cpu_s": cpus,
        "median_wall_s": round(statistics.median(walls), 3),
        "median_cpu_s": statistics.median(c for c in cpus if c is not None),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "interpret"), default="cuda")
    ap.add_argument("--children", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the figures here as well")
    args = ap.parse_args()
    if args.children < 1 or args.repeats < 1:
        ap.error("--children and --repeats must be at least 1")
    from kernels.harness import bytecode

    out = {
        "device": args.device,
        "python": sys.version.split()[0],
        "compiled_first": bytecode.ensure(),  # as the first sandboxed child would
        "children": children(args.device, args.children),
        **steps("cuda" if args.device == "cuda" else "cpu", args.repeats),
        "imports": imports("cuda" if args.device == "cuda" else "cpu"),
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
