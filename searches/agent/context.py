"""Gather a `PromptInput` for a search from the database (the reads behind the pure prompt)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kernels import problems as registry
from kernels.harness.roofline import place
from kernels.harness.static import PROHIBITIONS
from searches.agent import packs
from searches.agent.prompt import (
    LAUNCH_LATENCY_US,
    Incumbent,
    PackText,
    ProblemInfo,
    PromptInput,
    ShapeFloor,
    TrialNote,
)
from searches.models import Search, SearchNote, Trial, Worker

INTERPRET = "interpret"
MAX_NOTES = 20


def measured_ceilings(kind: str) -> dict[str, float] | None:
    worker = (
        Worker.objects.filter(kind=kind)
        .exclude(ceilings=None)
        .order_by("-last_heartbeat")
        .only("ceilings")
        .first()
    )
    c = worker.ceilings if worker else None
    if isinstance(c, dict) and c.get("copy_gbps") and c.get("matmul_tflops_bf16"):
        return c
    return None


def _pack_text(pack: packs.Pack | None) -> PackText | None:
    if pack is None:
        return None
    return PackText(pack.name, pack.version, pack.title, pack.body)


def problem_info(name: str, kind: str, ceilings: dict[str, Any] | None) -> ProblemInfo:
    problem = registry.load(name)
    tier = "smoke" if kind == INTERPRET else "full"
    dtype = problem.dtype(kind)
    shapes = []
    for shape in problem.shapes(tier):
        floor = bound = None
        if ceilings:
            spot = place(1.0, problem.flops(shape), problem.bytes(shape, dtype), ceilings)
            launch_ms = LAUNCH_LATENCY_US * 1e-3  # see LAUNCH_LATENCY_US
            floor = spot["floor_ms"] + launch_ms
            bound = "launch latency" if launch_ms >= spot["floor_ms"] else spot["bound"]
        shapes.append(ShapeFloor(registry.shape_label(shape), floor, bound))
    return ProblemInfo(
        name=problem.name,
        signature=problem.signature,
        description=problem.description,
        reference_source=problem.reference_source(),
        dtype=str(dtype).replace("torch.", ""),
        tier=tier,
        shapes=shapes,
    )


def _shape_lines(report: dict | None) -> tuple[list[str], str]:
    shapes = (report or {}).get("shapes") or []
    lines, bounds = [], Counter()
    for s in shapes:
        if not isinstance(s, dict):
            continue
        bound = s.get("bound")
        bound = bound if isinstance(bound, str) else None  # a report is the worker's word
        if bound:
            bounds[bound] += 1
        parts = [str(s.get("label") or s.get("shape") or "?")]
        for key, unit in (("candidate_ms", " ms"), ("speedup_eager", "x vs eager")):
            v = s.get(key)
            if isinstance(v, int | float):
                parts.append(f"{v:.3g}{unit}")
        frac = s.get("roofline_fraction")
        if isinstance(frac, int | float):
            parts.append(f"{frac:.0%} of roofline")
        if bound:
            parts.append(f"{bound} bound")
        lines.append(", ".join(parts))
    if bounds:
        name, n = bounds.most_common(1)[0]
        bottleneck = f"{name} bound on {n} of {len(shapes)} shapes"
    else:
        bottleneck = "unknown (untimed: the interpreter checks correctness only)"
    return lines, bottleneck


def _knobs(values: dict | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (values or {}).items())


def gather(search: Search, kind: str) -> PromptInput:
    idea = search.idea
    hardware = packs.hardware_for(kind)
    measured = measured_ceilings(kind)
    ceilings = measured or (hardware.datasheet_ceilings() if hardware else None)
    model_packs = [_pack_text(packs.get("model", name)) for name in idea.context_packs or []]

    incumbent = None
    inc = search.incumbent
    if inc is not None:
        lines, bottleneck = _shape_lines(inc.report)
        incumbent = Incumbent(
            index=inc.index,
            source=inc.source,
            speedup_eager=inc.speedup_eager,
            speedup_compiled=inc.speedup_compiled,
            geomean_ms=inc.geomean_ms,
            bottleneck=bottleneck,
            shapes=lines,
        )
    history = [
        TrialNote(
            index=t.index,
            proposer=t.proposer,
            model=t.model,
            status=t.status,
            failure=t.failure,
            reason="; ".join(str(r) for r in t.reasons or []),
            speedup_eager=t.speedup_eager,
            knobs=_knobs(t.knob_values),
            rationale=t.rationale,
        )
        for t in Trial.objects.filter(search=search)
        .order_by("index")
        .only(
            "index",
            "proposer",
            "model",
            "status",
            "failure",
            "reasons",
            "speedup_eager",
            "knob_values",
            "rationale",
        )
    ]
    notes = [(n.kind, n.text) for n in SearchNote.objects.filter(search=search)[:MAX_NOTES]]
    return PromptInput(
        idea_title=idea.title,
        idea_description=idea.description,
        problem=problem_info(idea.problem, kind, ceilings),
        gpu_kind=kind,
        hardware=_pack_text(hardware),
        ceilings=measured,
        harness_prohibitions=list(PROHIBITIONS),
        search_prohibitions=idea.prohibition_list,
        model_packs=[p for p in model_packs if p is not None],
        incumbent=incumbent,
        start_source=idea.start_source() if inc is None else "",
        history=history,
        notes=notes,
    )
