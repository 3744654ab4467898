"""A harness report (docs/harness.md, "Report") as rows for the trial page.

Reports come from GPU workers and are stored as JSON; a page must not fail on a field that is
missing, null, "NaN" or of the wrong type, so every read here is defensive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernels.engine.judge import number

SUMMARY_FIELDS = (
    ("geomean_ms", "geomean time", "ms"),
    ("geomean_speedup_eager", "geomean speedup vs eager", "speedup"),
    ("geomean_speedup_compiled", "geomean speedup vs torch.compile", "speedup"),
    ("min_speedup_eager", "worst shape vs eager", "speedup"),
    ("min_speedup_compiled", "worst shape vs torch.compile", "speedup"),
    ("noise", "noise (spread)", "pct"),
    ("wins_eager", "shapes faster than eager", "num"),
    ("wins_compiled", "shapes faster than torch.compile", "num"),
)


@dataclass
class CheckRow:
    name: str
    passed: bool | None  # None: not run here (e.g. "skipped: needs CUDA")
    detail: str


@dataclass
class ShapeRow:
    label: str
    passed: bool | None
    max_abs_err: Any
    rel_l2_err: Any
    candidate_ms: Any
    eager_ms: Any
    compiled_ms: Any
    speedup_eager: Any
    speedup_compiled: Any
    gbps: Any
    tflops: Any
    roofline_fraction: Any
    bound: str
    timing_mode: str
    samples: int | None = None  # the candidate's timing samples
    # Screening stopped sampling here: every sample was slower than this (the faster baseline's
    # cached median, ms), so the candidate lost the shape beyond doubt.
    slower_than_ms: float | None = None


@dataclass
class SummaryRow:
    label: str
    value: Any
    format: str  # the autoweb_format filter that shows it


@dataclass
class ReportView:
    verdict: str = ""
    failure: str = ""
    reasons: list[str] = field(default_factory=list)
    checks: list[CheckRow] = field(default_factory=list)
    shapes: list[ShapeRow] = field(default_factory=list)
    summary: list[SummaryRow] = field(default_factory=list)
    device: dict[str, Any] = field(default_factory=dict)
    ceilings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tier: str = ""
    dtype: str = ""
    sandbox: list[SandboxRow] = field(default_factory=list)
    references: str = ""  # which oracle computed the outputs' float64 references


@dataclass(frozen=True)
class SandboxRow:
    """One isolation layer the candidate's process ran under, or did not."""

    label: str
    applied: bool


def _sandbox(report: dict[str, Any]) -> list[SandboxRow]:
    """What the harness says the candidate's process got (kernels/harness/sandbox.py): shown
    so that nobody assumes more isolation than the host gave. Empty for reports without it."""
    sb = report.get("sandbox")
    if not isinstance(sb, dict):
        return []
    conf = _dict(sb.get("confinement"))
    abi = conf.get("abi")
    landlock = f" (Landlock ABI {abi})" if type(abi) is int and abi > 0 else " (Landlock)"
    rows = [
        SandboxRow("network namespace", sb.get("network_isolated") is True),
        SandboxRow("write confinement" + landlock, sb.get("filesystem_confined") is True),
        SandboxRow("socket filter (seccomp)", sb.get("sockets_denied") is True),
    ]
    if "signals" in conf:
        rows.append(SandboxRow("signal scope", conf.get("signals") is True))
    return rows


def _references(report: dict[str, Any]) -> str:
    """Which oracle computed the float64 references the outputs were checked against
    (docs/harness.md, Measurement), for the checks' card; "" where the report does not say
    (the compiled oracle off, or a report from before it) or says it with garbage."""
    refs = _dict(report.get("references"))
    compiled, eager = _count(refs.get("compiled"), 0), _count(refs.get("eager"), 0)
    if compiled is None or eager is None or compiled + eager == 0:
        return ""
    if not compiled:
        return f"Float64 references: all {eager} from the eager oracle."
    return (
        f"Float64 references: {compiled} from the compiled oracle, on shapes where it had "
        f"agreed with the eager one, and {eager} from the eager oracle."
    )


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _passed(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _worst(errors: dict[str, Any], key: str) -> Any:
    """The largest `key` over every output checked (first call, second call, graph replay...)."""
    numbers = [
        e[key]
        for e in errors.values()
        if isinstance(e, dict) and isinstance(e.get(key), int | float)
    ]
    if numbers:
        return max(numbers)
    texts = [e.get(key) for e in errors.values() if isinstance(e, dict) and e.get(key)]
    return texts[0] if texts else None


def _shape(raw: Any) -> ShapeRow | None:
    if not isinstance(raw, dict):
        return None
    errors = _dict(raw.get("errors"))
    label = raw.get("label")
    if not label and isinstance(raw.get("shape"), dict):
        label = ",".join(f"{k}={v}" for k, v in raw["shape"].items())
    return ShapeRow(
        label=_text(label),
        passed=_passed(raw.get("passed")),
        max_abs_err=_worst(errors, "max_abs_err"),
        rel_l2_err=_worst(errors, "rel_l2_err"),
        candidate_ms=raw.get("candidate_ms"),
        eager_ms=raw.get("eager_ms"),
        compiled_ms=raw.get("compiled_ms"),
        speedup_eager=raw.get("speedup_eager"),
        speedup_compiled=raw.get("speedup_compiled"),
        gbps=raw.get("gbps"),
        tflops=raw.get("tflops"),
        roofline_fraction=raw.get("roofline_fraction"),
        bound=_text(raw.get("bound")),
        timing_mode=_text(raw.get("timing_mode")),
        samples=_count(raw.get("candidate_samples")),
        slower_than_ms=_positive(number(raw.get("candidate_slower_than_ms"))),
    )


def _count(x: Any, least: int = 1) -> int | None:
    """`x` where it is a whole number of at least `least`, else None."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= least else None


def _positive(x: float | None) -> float | None:
    return x if x is not None and x > 0 else None


def report_view(report: Any) -> ReportView:
    report = _dict(report)
    checks = [
        CheckRow(
            name=_text(name),
            passed=_passed(_dict(c).get("passed")),
            detail=_text(_dict(c).get("detail") if isinstance(c, dict) else c),
        )
        for name, c in _dict(report.get("checks")).items()
    ]
    summary = _dict(report.get("summary"))
    device = _dict(report.get("device"))
    return ReportView(
        verdict=_text(report.get("verdict")),
        failure=_text(report.get("failure")),
        reasons=[_text(r) for r in _list(report.get("reasons"))],
        checks=checks,
        shapes=[row for row in map(_shape, _list(report.get("shapes"))) if row is not None],
        summary=[
            SummaryRow(label=label, value=summary[key], format=fmt)
            for key, label, fmt in SUMMARY_FIELDS
            if summary.get(key) is not None
        ],
        device=device,
        ceilings=_dict(device.get("ceilings")),
        notes=[_text(n) for n in _list(report.get("notes"))],
        tier=_text(report.get("tier")),
        dtype=_text(report.get("dtype")),
        sandbox=_sandbox(report),
        references=_references(report),
    )


def paired_shapes(
    first: list[ShapeRow], second: list[ShapeRow]
) -> list[tuple[str, ShapeRow | None, ShapeRow | None]]:
    """Two reports' per-shape rows matched by shape label, in the first report's order, then
    any shape only the second has: (label, first's row or None, second's row or None)."""
    by_label = {row.label: row for row in second}
    pairs = [(row.label, row, by_label.pop(row.label, None)) for row in first]
    return pairs + [(label, None, row) for label, row in by_label.items()]
