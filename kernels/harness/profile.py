"""`python -m kernels profile`: the evaluation report plus Nsight Compute counters.

The candidate's kernels are run once per shape inside an NVTX range in a sandboxed child
under `ncu`; DRAM and SM throughput (% of peak) and achieved occupancy of every kernel in the
range are attached to the report. Clocks are left as they are (`--clock-control none`).
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

from kernels import problems
from kernels.harness import evaluate, request_for, run
from kernels.harness.sandbox import read_own_file

METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "gpu__time_duration.sum": "duration",
}


class ProfileError(RuntimeError):
    pass


def parse_ncu_csv(text: str) -> list[dict]:
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows: dict[str, dict] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        key = r.get("ID", "")
        row = rows.setdefault(key, {"id": key, "kernel": r.get("Kernel Name", "")[:80]})
        name = METRICS.get(r.get("Metric Name", ""))
        if name:
            unit = r.get("Metric Unit", "")
            val = r.get("Metric Value", "").replace(",", "")
            try:
                row[name] = round(float(val), 2)
            except ValueError:
                row[name] = val
            if name == "duration":
                row["duration_unit"] = unit
    return list(rows.values())


def profile(
    problem: problems.Problem, source: str, *, tier: str = "smoke", timeout_s: float | None = None
) -> dict:
    ncu = shutil.which("ncu")
    if not ncu:
        raise ProfileError("ncu (Nsight Compute) is not on PATH")
    report = evaluate(problem, source, device="cuda", tier=tier, timeout_s=timeout_s)
    if report["verdict"] != "accepted":
        return report
    wrapper = [
        ncu,
        "--clock-control",
        "none",
        "--nvtx",
        "--nvtx-include",
        "autoweb_profile/",
        "--metrics",
        ",".join(METRICS),
        "--csv",
        "--target-processes",
        "all",
    ]
    request = request_for(
        problem,
        [source],
        device="cuda",
        tier=tier,
        timeout_s=timeout_s,
        budget_s=0.0,
        baselines_compiled=False,
        verify=False,
        extra={"profile": True},
    )
    prof = run(request, wrapper=wrapper)
    log = prof.get("notes", [])
    p = Path(prof.get("sandbox_dir", "")) / "child.log"
    text = read_own_file(p)
    shutil.rmtree(p.parent, ignore_errors=True)
    report["profile"] = {"tool": "ncu", "kernels": parse_ncu_csv(text), "notes": log[:5]}
    return report
