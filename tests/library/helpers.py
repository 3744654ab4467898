"""Queue candidates for the library's tests: judged trials with harness-shaped reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from searches import services
from searches.models import Search, Trial
from tests.web.domain import SOFTMAX_SEED, judge

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HONEST_SOFTMAX = (FIXTURES / "honest" / "softmax_tuned.py").read_text()
WRONG_OUTSIDE_SMOKE = (FIXTURES / "revalidation" / "wrong_outside_smoke.py").read_text()

SHAPES = [
    {"shape": {"M": 1, "N": 4096}, "label": "M=1,N=4096"},
    {"shape": {"M": 4096, "N": 1000}, "label": "M=4096,N=1000"},
    {"shape": {"M": 256, "N": 32768}, "label": "M=256,N=32768"},
]


def report(
    ms: float = 0.5,
    noise: float = 0.01,
    *,
    eager: float = 0.6,
    compiled: float | None = 0.55,
    kind: str = "h200",
    checks: dict[str, Any] | None = None,
    shapes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An accepted report: speedup vs eager eager/ms, vs torch.compile compiled/ms, on
    `shapes` ({"shape", "label"} rows; default: three softmax shapes)."""
    rows = shapes if shapes is not None else SHAPES
    shapes = []
    for row in rows:
        shapes.append(
            {
                **row,
                "passed": True,
                "candidate_ms": ms,
                "eager_ms": eager,
                "compiled_ms": compiled,
                "speedup_eager": eager / ms,
                "speedup_compiled": compiled / ms if compiled else None,
                "roofline_fraction": 0.8,
                "bound": "memory",
                "errors": {"first": {"max_abs_err": 1e-3, "rel_l2_err": 1e-3, "passed": True}},
            }
        )
    return {
        "verdict": "accepted",
        "failure": None,
        "reasons": [],
        "tier": "full",
        "dtype": "bfloat16",
        "summary": {
            "geomean_ms": ms,
            "noise": noise,
            "geomean_speedup_eager": eager / ms,
            "geomean_speedup_compiled": compiled / ms if compiled else None,
        },
        "device": {
            "kind": kind,
            "name": "NVIDIA H200",
            "versions": {"torch": "2.11.0", "triton": "3.6.0"},
        },
        "checks": checks
        if checks is not None
        else {
            "correctness": {"passed": True, "detail": "fresh random inputs"},
            "cuda_graph": {"passed": True, "detail": "captured and replayed"},
            "roofline": {"passed": True, "detail": "within ceilings"},
        },
        "shapes": shapes,
        "sandbox": {
            "network_isolated": True,
            "filesystem_confined": True,
            "sockets_denied": False,
            "confinement": {"abi": 7, "filesystem": True, "tcp": True, "signals": True},
        },
    }


def candidate(
    search: Search,
    source: str | None = None,
    *,
    parent: Trial | None = None,
    rationale: str = "wider blocks",
    prompt: str | None = "Make softmax faster.",
    **report_kw: Any,
) -> Trial:
    """Record and judge one trial (kept when faster than the incumbent)."""
    n = search.trials.count() + 1
    trial = services.record_proposal(
        search=search,
        source=source if source is not None else SOFTMAX_SEED + f"\n# candidate {n}\n",
        parent=parent,
        proposer="llm:test-model",
        model="test-model",
        rationale=rationale,
        prompt=prompt,
    )
    return judge(trial, report(**report_kw), gpu_seconds=1.0)  # a win confirmed, as the loop does


def bulk_releases(
    search: Search,
    approver: Any,
    n: int,
    *,
    problem: str = "softmax",
    kind: str = "h200",
    speedup: Any = lambda i: 1.0 + i / 100,
) -> list[Any]:
    """`n` releases of `problem` on `kind` in a few bulk inserts, the newest last (release i is
    i seconds after the first), each from its own approved trial with a ~20 KB report and
    per-shape rows as big: what a list must not load."""
    from datetime import timedelta

    from django.utils import timezone

    from library.models import Release, Revalidation, Review

    base = search.trials.count()
    now = timezone.now()
    heavy = report()
    heavy["padding"] = "r" * 20_000
    shapes = [{"label": f"shape {j}", "padding": "s" * 200} for j in range(100)]
    trials = Trial.objects.bulk_create(
        Trial(
            search=search,
            index=base + i,
            source=SOFTMAX_SEED + f"\n# release {base + i}\n",
            source_sha256=f"{search.pk:08x}{base + i:056x}",
            proposer="tuner",
            status=Trial.Status.KEPT,
            report=heavy,
            device_kind=kind,
            speedup_eager=speedup(i),
            finished_at=now,
        )
        for i in range(1, n + 1)
    )
    reviews = Review.objects.bulk_create(
        Review(trial=t, action=Review.Action.APPROVE, reviewer=approver, text="ok") for t in trials
    )
    revals = Revalidation.objects.bulk_create(
        Revalidation(review=r, kind=kind, status=Revalidation.Status.PASSED) for r in reviews
    )
    return Release.objects.bulk_create(
        Release(
            problem=problem,
            kind=kind,
            dtype="bfloat16",
            shape_range={"M": [1, 4096], "N": [1, 65536]},
            source=t.source,
            source_sha256=t.source_sha256,
            trial=t,
            revalidation=rv,
            speedup_eager=t.speedup_eager,
            speedup_compiled=None,
            shapes=shapes,
            approver=approver,
            created_at=now + timedelta(seconds=i),
        )
        for i, (t, rv) in enumerate(zip(trials, revals, strict=True), start=1)
    )


def fresh_venv(where: Path) -> Path:
    """A new virtual environment that sees this one's torch, triton and numpy but not autoweb
    or Django; its python. The packages come in as a plain path entry (a .pth file naming a
    directory of links), so the editable install of autoweb found in site-packages (a .pth
    hook) stays inactive, and nothing is downloaded."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p))
    deps = where / "deps"
    deps.mkdir()
    for found in os.listdir(site):
        hidden = found.endswith(".pth") or found.startswith(("__editable__", "autoweb", "django"))
        if not hidden:
            os.symlink(os.path.join(site, found), deps / found)
    (next((venv / "lib").glob("python*")) / "site-packages" / "deps.pth").write_text(f"{deps}\n")
    return venv / "bin" / "python"


def venv_with(wheel: Path, where: Path) -> Path:
    """`fresh_venv` with the exported wheel installed (offline, nothing else); its python."""
    py = fresh_venv(where)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    return py
