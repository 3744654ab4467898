"""Time to build and serialise the chart figures: this tree's `searches.charts` against another
version of the module (e.g. the hand-built-JSON one before graph_objects), interleaved, median
of 15 each. No database: the rows are synthetic.

    git show REV:searches/charts.py > /tmp/charts_old.py
    DJANGO_SETTINGS_MODULE=autoweb.settings python benchmarks/chart_build.py /tmp/charts_old.py
"""

from __future__ import annotations

import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from searches import charts as new  # noqa: E402

spec = importlib.util.spec_from_file_location("charts_old", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
rng = random.Random(0)


def trials(n):
    rows = []
    for i in range(1, n + 1):
        st = rng.choice(["kept", "reverted", "reverted", "failed"])
        rows.append(
            {
                "index": i,
                "status": st,
                "failure": "incorrect" if st == "failed" else None,
                "speedup_eager": None if st == "failed" else rng.uniform(0.5, 3),
                "label": f"t{i}",
                "url": f"/t/{i}",
            }
        )
    return rows


pts = [
    {
        "problem": rng.choice(["softmax", "rmsnorm", "matmul"]),
        "intensity": rng.uniform(0.1, 100),
        "tflops": rng.uniform(1, 500),
        "status": "kept",
        "label": "x",
        "url": "/x",
    }
    for _ in range(300)
]
counts = [
    {"group": g, "outcome": o, "count": rng.randint(0, 50)}
    for g in ("tuner", "llm:a", "llm:b")
    for o in old.OUTCOMES
]
small, large = trials(100), trials(5000)
cases = {
    "progress 100 trials": lambda m: m.search_progress(small),
    "progress 5,000 trials (decimated to 2,000)": lambda m: m.search_progress(large),
    "roofline 300 points": lambda m: m.roofline(
        "h200", {"copy_gbps": 4000, "matmul_tflops_bf16": 900}, pts
    ),
    "failure shares": lambda m: m.failure_shares(counts),
}
for name, fn in cases.items():
    t = {"old": [], "new": []}
    for _ in range(15):
        for label, m in (("old", old), ("new", new)):
            s = time.perf_counter()
            json.dumps(fn(m))
            t[label].append(time.perf_counter() - s)
    o, n = statistics.median(t["old"]) * 1e3, statistics.median(t["new"]) * 1e3
    print(f"| {name} | {o:.1f} | {n:.1f} |")
