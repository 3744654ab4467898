"""While a candidate is being timed, nothing else of ours runs on its GPU: the caller verifies
the outputs produced inside the timing loop only after the child has finished timing, and a
candidate sharing the GPU lets it go between shapes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernels import problems
from kernels.harness import evaluate, retime, sandbox
from kernels.harness.baselines import BaselineCache
from kernels.harness.evaluation import _Pump

SEED = (Path(__file__).resolve().parents[2] / "kernels" / "seeds" / "softmax.py").read_text()


@pytest.mark.gpu
def test_timed_outputs_are_verified_after_the_exclusive_timing_phase() -> None:
    report = evaluate("softmax", SEED, device="cuda", tier="smoke")

    assert report["verdict"] == "accepted", report["reasons"]
    tl = report["timeline"]
    assert tl["benchmarking"] <= tl["gpu_done"] <= tl["timed_verified"], tl
    for shape in report["shapes"]:
        assert shape["errors"]["timed0"]["passed"], shape["label"]
    assert report["checks"]["timed_outputs"]["passed"] is True


@pytest.fixture
def holds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every hold of the GPU lock this process takes, in order: "shared" or "exclusive"."""
    taken: list[str] = []
    acquire = sandbox.GpuLock.acquire

    def counted(self: sandbox.GpuLock) -> sandbox.GpuLock:
        taken.append("shared" if self.shared else "exclusive")
        return acquire(self)

    monkeypatch.setattr(sandbox.GpuLock, "acquire", counted)
    return taken


@pytest.mark.gpu
def test_a_screened_candidate_shares_the_gpu_one_shape_at_a_time(
    tmp_path: Path, holds: list[str]
) -> None:
    # Each shared hold covers one shape: verifying n shapes and preparing n shapes asks for the
    # GPU 2n times before the one exclusive hold, so a timing phase waiting at the turnstile
    # waits for at most one shape of this candidate, never for all of them.
    cache = BaselineCache(tmp_path)
    evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)  # measures them
    holds.clear()

    report = evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)

    assert report["verdict"] == "accepted", report["reasons"]
    n = len(report["shapes"])
    assert n > 1
    # (After the exclusive hold come only the checks of the timed outputs, and a re-measure
    # of the baselines should the canary have drifted.)
    assert holds.index("exclusive") == 2 * n, holds
    # The report counts the holds its caller took (a re-measure of the baselines takes its own)
    # and the time it waited for them.
    wait = report["gpu_wait"]
    assert 2 * n + 1 <= wait["holds"] <= len(holds), (wait, holds)
    assert wait["shared_s"] >= 0 and wait["exclusive_s"] >= 0, wait


@pytest.mark.gpu
def test_a_retime_in_the_cached_modes_prepares_while_the_gpu_is_shared(
    tmp_path: Path, holds: list[str]
) -> None:
    # With the screening's cache, a re-time knows each shape's timing mode: its inputs, warm-up
    # and graph capture happen under one shared hold per shape, and the exclusive hold is
    # samples only. Without it, the modes are chosen from quick timings inside the exclusive
    # hold, where no other process's kernels distort them.
    cache = BaselineCache(tmp_path)
    evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)  # measures them
    n = len(problems.load("softmax").shapes("smoke"))
    holds.clear()

    cached = retime("softmax", [SEED, SEED], device="cuda", tier="smoke", baselines=cache)

    assert all(r["geomean_ms"] for r in cached), cached
    assert holds.index("exclusive") == 1 + n, holds  # the first shared hold, then one per shape
    holds.clear()

    plain = retime("softmax", [SEED, SEED], device="cuda", tier="smoke")

    assert all(r["geomean_ms"] for r in plain), plain
    assert holds.index("exclusive") == 1, holds


def test_a_gpu_slot_is_held_once_per_run_and_its_wait_is_reported() -> None:
    slots = threading.Semaphore(1)
    pump = _Pump(run=None, child=None, request=None, dinfo={}, n_sources=1, slots=slots)
    slots.acquire()  # another evaluation is on the GPU
    threading.Timer(0.3, slots.release).start()

    pump.take_slot()

    assert pump.slotted and pump.slot_wait >= 0.25, pump.slot_wait
    assert pump.waited["slot_s"] == pump.slot_wait
    pump.take_slot()  # the child asks again between shapes: the run already holds its slot
    assert pump.slot_wait >= 0.25
    assert not slots.acquire(blocking=False)
    pump.release_slot()
    pump.release_slot()  # given back once, however often the run ends
    assert slots.acquire(blocking=False)
    assert not slots.acquire(blocking=False)


def test_without_slots_a_run_reports_no_slot_wait() -> None:
    pump = _Pump(run=None, child=None, request=None, dinfo={}, n_sources=1)

    pump.take_slot()
    pump.release_slot()

    assert not pump.slotted and "slot_s" not in pump.waited


@pytest.mark.gpu
def test_evaluations_beyond_the_gpu_slots_wait_after_compiling(tmp_path: Path) -> None:
    # One slot, two evaluations in flight: both load and compile at once, one verifies and
    # times while the other waits for the slot; the wait is the caller's queue, reported, and
    # both are judged as they would be alone.
    cache = BaselineCache(tmp_path)
    evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)  # measures them
    slots = threading.Semaphore(1)

    with ThreadPoolExecutor(2) as pool:
        reports = list(
            pool.map(
                lambda _: evaluate(
                    "softmax", SEED, device="cuda", tier="smoke", baselines=cache, gpu_slots=slots
                ),
                range(2),
            )
        )

    assert [r["verdict"] for r in reports] == ["accepted", "accepted"], reports
    waits = sorted(r["gpu_wait"]["slot_s"] for r in reports)
    assert waits[0] < 0.1 and waits[1] > 0.2, waits  # the second waited for the first's stage
    assert slots.acquire(blocking=False)  # given back


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["blocking", "auto"])
def test_the_childs_cuda_context_waits_as_asked(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    if mode == "blocking":
        monkeypatch.setenv("AUTOWEB_CUDA_SYNC", "blocking")
    else:
        monkeypatch.delenv("AUTOWEB_CUDA_SYNC", raising=False)  # the default: CUDA's choice

    report = evaluate("softmax", SEED, device="cuda", tier="smoke")

    assert report["verdict"] == "accepted", report["reasons"]
    assert report["sandbox"]["cuda_sync"] == mode
