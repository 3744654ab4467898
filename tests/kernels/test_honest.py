"""No false positives: honest kernels pass every check on the interpreter smoke sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import problems
from kernels.harness import evaluate
from kernels.knobs import parse_knobs, rewrite

HONEST = Path(__file__).resolve().parents[1] / "fixtures" / "honest"
TUNED = sorted(HONEST.glob("*_tuned.py"))


def _assert_clean(report: dict, what: str) -> None:
    failed = {k: v["detail"] for k, v in report["checks"].items() if v["passed"] is False}
    assert report["verdict"] == "accepted", f"{what}: {report['failure']}: {report['reasons']}"
    assert report["failure"] is None
    assert report["reasons"] == []
    assert not failed, f"{what}: checks failed on an accepted report: {failed}"
    for name in ("static", "output_contract", "correctness", "library_fallback"):
        assert report["checks"][name]["passed"] is True, (what, name, report["checks"][name])
    assert report["summary"]["shapes_passed"] == report["summary"]["shapes"] > 0


@pytest.mark.parametrize("name", problems.names())
def test_every_seed_is_accepted_with_no_failed_check(name: str) -> None:
    problem = problems.load(name)

    report = evaluate(problem, problem.seed_path.read_text(), device="interpret", tier="smoke")

    _assert_clean(report, f"seed {name}")
    # The sandboxed process's CPU seconds when each phase began, read by the caller: they
    # only grow, and its start-up in the pool is already in the first.
    cpu, tl = report["timeline_cpu"], report["timeline"]
    assert set(cpu) <= set(tl) and {"compiling", "verifying"} <= set(cpu), (cpu, tl)
    by_time = [cpu[p] for p in sorted(cpu, key=tl.__getitem__)]
    assert by_time == sorted(by_time) and by_time[0] > 0, cpu


@pytest.mark.parametrize("path", TUNED, ids=lambda p: p.stem)
def test_every_tuned_honest_kernel_is_accepted_with_no_failed_check(path: Path) -> None:
    name = path.stem.removesuffix("_tuned")

    report = evaluate(name, path.read_text(), device="interpret", tier="smoke")

    _assert_clean(report, path.name)


@pytest.mark.parametrize("end", ["first", "last"])
@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
def test_a_seed_retuned_to_its_extreme_knob_values_is_still_accepted(name: str, end: str) -> None:
    source = problems.load(name).seed_path.read_text()
    knobs = parse_knobs(source)
    values = {k.name: k.choices[0 if end == "first" else -1] for k in knobs}
    retuned = rewrite(source, values)
    assert retuned != source, f"{name}: the {end} choices are the seed's own values"

    report = evaluate(name, retuned, device="interpret", tier="smoke")

    _assert_clean(report, f"{name} seed with {values}")


def test_progress_says_compiled_once_before_verifying_and_its_failures_fail_nothing() -> None:
    # "compiled" is what a search's flight waits for (kernels.engine.flight); the callback is
    # the caller's (a worker publishes to Redis): its failing is no fault of the candidate.
    problem = problems.load("softmax")
    phases: list[str] = []

    def on_event(event: dict) -> None:
        phases.append(event["phase"])
        raise ConnectionError("Redis went away")

    report = evaluate(problem, problem.seed_path.read_text(), device="interpret", tier="smoke",
                      on_event=on_event)  # fmt: skip

    _assert_clean(report, "softmax seed with a failing progress callback")
    assert phases.count("compiled") == 1
    assert phases.index("compiling") < phases.index("compiled") < phases.index("verifying")
    assert [n for n in report["notes"] if n.startswith("progress not delivered")] == [
        "progress not delivered to the caller: ConnectionError: Redis went away"
    ]
