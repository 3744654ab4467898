"""Queue candidates for the library's tests: judged trials with harness-shaped reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from searches import services
from searches.models import Search, Trial
from tests.web.domain import SOFTMAX_SEED

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
) -> dict[str, Any]:
    """An accepted report: speedup vs eager eager/ms, vs torch.compile compiled/ms."""
    shapes = []
    for row in SHAPES:
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
    return services.record_result(trial=trial, report=report(**report_kw), gpu_seconds=1.0)
