"""Trials recorded from real H200 harness runs (docs/benchmarks/h200/*.json), through the same
services the orchestrator uses: the charts' tests draw what the GPU actually measured.

- proof-2026-12-02-b.json: per problem, the seed's full report (kept), the tuner's trials
  (kept / reverted / failed with their real failure) and, where present, the best config's
  full report;
- proof-2026-12-02-a.json: 39 evaluations of planted exploits (each failed with its category)
  and the seed after them, recorded as an LLM search on softmax;
- cli-softmax-seed-full.json: the CLI's full report of the softmax seed.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from kernels import problems as registry
from searches import services
from searches.models import Search, Trial, Worker
from tests.web.domain import idea_kwargs, judge

H200_DIR = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "h200"
LLM_MODEL = "qwen2.5-coder-32b"


@cache
def load(name: str) -> dict[str, Any]:
    return json.loads((H200_DIR / name).read_text())


def proof_b() -> dict[str, Any]:
    return load("proof-2026-12-02-b.json")


def proof_a() -> dict[str, Any]:
    return load("proof-2026-12-02-a.json")


def seed_source(problem: str, tag: str) -> str:
    return registry.load(problem).seed_path.read_text() + f"\n# {tag}\n"


def _device(report_device: dict[str, Any], kind: str | None = None) -> dict[str, Any]:
    device = dict(report_device)
    if kind is not None:
        device["kind"] = kind
    return device


def tuner_report(trial: dict[str, Any], device: dict[str, Any]) -> dict[str, Any]:
    """The harness report a tuner trial of proof-b summarises (its summary numbers are real)."""
    if trial["status"] == "failed":
        return {
            "verdict": "rejected",
            "failure": trial["failure"],
            "reasons": [trial["reason"][:300]],
            "summary": {"geomean_ms": None, "noise": None},
            "device": device,
        }
    speedups = trial.get("speedups") or {}
    return {
        "verdict": "accepted",
        "failure": None,
        "reasons": [],
        "summary": {
            "geomean_ms": trial["geomean_ms"],
            "noise": trial["noise"],
            "geomean_speedup_eager": speedups.get("eager"),
            "geomean_speedup_compiled": speedups.get("compiled"),
        },
        "device": device,
        "shapes": [],
    }


def _search(engineer: Any, problem: str, **overrides: Any) -> Search:
    kwargs = idea_kwargs(
        engineer,
        problem=problem,
        title=f"Tune {problem} on H200",
        max_trials=200,
        prohibitions="",
        **overrides,
    )
    idea = services.create_idea(**kwargs)
    return services.begin_search(search=services.start_search(idea=idea, user=engineer))


def _trial(search: Search, tag: str, report: dict[str, Any], **proposal: Any) -> Trial:
    proposal.setdefault("proposer", "tuner")
    trial = services.record_proposal(
        search=search,
        source=seed_source(search.idea.problem, tag),
        parent=None,
        **proposal,
    )
    seconds = float((report.get("summary") or {}).get("seconds") or 2.0)
    return judge(trial, report, gpu_seconds=seconds)  # a win confirmed, as the loop does


def record_worker() -> Worker:
    device = proof_b()["device"]
    return services.upsert_worker(
        name="h200-host:gpu0",
        kind="h200",
        device_name=device["name"],
        ceilings=proof_b()["ceilings"],
        versions=device["versions"],
        queue="gpu.h200",
    )


def record_tuner_searches(engineer: Any, problems: list[str] | None = None) -> dict[str, Search]:
    """One tuner search per problem of proof-b: seed, tuner trials, best config."""
    out = {}
    for name, data in proof_b()["problems"].items():
        if problems is not None and name not in problems:
            continue
        search = _search(engineer, name)
        seed = data["seed"]
        _trial(search, "seed", seed, rationale="the seed kernel, full sweep")
        for t in data.get("tune", {}).get("trials", []):
            _trial(
                search,
                f"tune {t['index']}",
                tuner_report(t, seed["device"]),
                rationale=t["description"],
                knob_values=t["values"],
            )
        if "best" in data:
            _trial(search, "best", data["best"], rationale="the tuner's best config, full sweep")
        search.refresh_from_db()
        out[name] = search
    return out


def record_exploit_search(engineer: Any) -> Search:
    """Proof-a's planted exploits as an LLM search on softmax: 38 failures, then the seed."""
    search = _search(engineer, "softmax", proposer=f"llm:{LLM_MODEL}")
    device = _device(proof_a()["device"])
    for n, exploit in enumerate(proof_a()["exploits"]):
        if exploit["verdict"] == "rejected":
            report = {
                "verdict": "rejected",
                "failure": exploit["failure"],
                "reasons": exploit["reasons"],
                "summary": {},
                "device": device,
            }
        else:
            report = load("cli-softmax-seed-full.json")
        _trial(
            search,
            f"exploit {n} {exploit['fixture']}",
            report,
            proposer=f"llm:{LLM_MODEL}",
            model=LLM_MODEL,
            rationale=f"planted exploit: {exploit['fixture']}",
            tokens_in=900,
            tokens_out=400,
        )
    search.refresh_from_db()
    return search
