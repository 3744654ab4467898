"""While a candidate is being timed, nothing else of ours runs on its GPU: the caller verifies
the outputs produced inside the timing loop only after the child has finished timing, and a
candidate sharing the GPU lets it go between shapes."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernels import problems
from kernels.harness import childrun, evaluate, gpulock, retime, verdict
from kernels.harness.baselines import BaselineCache
from kernels.harness.evaluation import _Pump
from kernels.protocol import EvaluationRequest

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "kernels" / "seeds" / "softmax.py").read_text()


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
    """Every hold of the GPU lock this process takes, in order: "shared" or "exclusive", and
    "check" for the shared holds of the caller's checks of verified outputs (on their own
    thread, `_Pump.check_hold`)."""
    taken: list[str] = []
    acquire = gpulock.GpuLock.acquire

    def counted(self: gpulock.GpuLock) -> gpulock.GpuLock:
        checks = threading.current_thread().name.startswith("autoweb-checks")
        taken.append("check" if checks else "shared" if self.shared else "exclusive")
        return acquire(self)

    monkeypatch.setattr(gpulock.GpuLock, "acquire", counted)
    return taken


@pytest.mark.gpu
def test_a_screened_candidate_shares_the_gpu_one_shape_at_a_time(
    tmp_path: Path, holds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each shared hold covers one step of one shape: verifying n shapes asks for the GPU three
    # times a shape (the first call, the call on new values, the graph replay); preparing asks
    # for it before a shape's warm-up, after it and, in graph mode, before each function's
    # capture (the candidate's, and the eager canary's on one shape). So a timing phase waiting
    # at the turnstile waits for at most one step of this candidate, never for all its shapes.
    cache = BaselineCache(tmp_path)
    evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)  # measures them
    holds.clear()
    trace = tmp_path / "locks.txt"
    monkeypatch.setenv("AUTOWEB_GPU_LOCK_TRACE", str(trace))

    report = evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)

    assert report["verdict"] == "accepted", report["reasons"]
    n = len(report["shapes"])
    assert n > 1
    # The lock's trace names each of the child's shared holds by the step it covered.
    steps = [line.split()[0] for line in trace.read_text().splitlines() if " shared " in line]
    for step in ("verify-first", "verify-second", "verify-graph", "prepare-warmup"):
        assert steps.count(f"step-{step}") == n, (step, steps)
    assert steps.count("step-prepare-mode") == n, steps
    assert steps.count("step-prepare-capture") <= n + 1, steps  # graph mode: one, the canary two
    # The child's CUDA context is created under one shared hold of its own, traced by the
    # caller as "child-init": one child for the candidate, and one more only where a drifted
    # canary had the baselines measured again in a clean sandbox.
    remeasured = report["baselines"].get("source") == "re-measured after drift"
    assert steps.count("child-init") == 1 + remeasured, steps
    assert set(steps) <= {f"step-{s}" for s in childrun.STEPS} | {"check", "child-init"}, steps
    # (After the exclusive hold come only the checks of the timed outputs, and a re-measure
    # of the baselines should the canary have drifted.)
    before = holds[: holds.index("exclusive")]
    assert 3 * n + 2 * n <= before.count("shared") <= 3 * n + 3 * n + 1, holds
    # The caller's checks hold the GPU on their own: one hold per shape for the references of
    # its three outputs (first call, new values, graph replay), and one more per output where
    # the reference is too large for the host and is compared on the GPU.
    big = sum(math.prod(r["shape"].values()) > verdict.HOST_COMPARE_MAX for r in report["shapes"])
    assert before.count("check") == n + 3 * big, holds
    # The caller chose each shape's timing mode, so the reference of each timed output was
    # computed in that same hold (verdict.Run.timed_which): after the exclusive hold their
    # checks take none, but where an output is compared on the GPU (its reference and its
    # comparison, one hold each).
    after = holds[holds.index("exclusive") + 1 :]
    assert after.count("check") == 2 * big, holds
    assert report["gpu_wait"].get("timed_early", 0) == n - big, report["gpu_wait"]
    # The report counts the holds its caller took (a re-measure of the baselines takes its own)
    # and the time it waited for them.
    wait = report["gpu_wait"]
    assert 5 * n + 1 <= wait["holds"] <= len(holds), (wait, holds)
    assert wait["shared_s"] >= 0 and wait["exclusive_s"] >= 0, wait


@pytest.mark.gpu
def test_screening_stops_sampling_a_shape_the_candidate_has_lost(tmp_path: Path) -> None:
    # A bar no kernel beats: the compiled baseline's cached times made a nanosecond. The
    # candidate loses every shape beyond doubt at six samples, and sampling stops there; on the
    # canary shape the eager baseline timed beside it still needs ten samples and a tight
    # median. With the real times the same kernel is sampled as before wherever it may win.
    from kernels.harness import baselines as bl
    from kernels.harness import device as devmod
    from kernels.harness import timing

    cache = BaselineCache(tmp_path)
    honest = evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)
    assert honest["verdict"] == "accepted", honest["reasons"]
    for shape in honest["shapes"]:
        if shape.get("candidate_slower_than_ms") is not None:
            assert shape["candidate_ms"] > shape["candidate_slower_than_ms"], shape
        else:
            assert shape["candidate_samples"] >= timing.SCREEN_MIN_SAMPLES, shape
    problem = problems.load("softmax")
    dtype = str(problem.dtype("cuda")).replace("torch.", "")
    fields = bl.key_fields(problem, devmod.info("cuda"), dtype)
    labels = [s["label"] for s in honest["shapes"]]
    entries = cache.get(fields, labels)
    assert entries is not None
    for e in entries:
        e["compiled"] = {**(e.get("compiled") or e["eager"]), "median": 1e-6}
    cache.put(fields, labels, entries)

    report = evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)

    assert report["verdict"] == "accepted", report["reasons"]
    canary = bl.canary_index(entries)
    for i, shape in enumerate(report["shapes"]):
        assert shape["candidate_ms"] > 1e-6 and not shape["win_compiled"], shape
        if i == canary:
            assert shape["candidate_samples"] >= timing.SCREEN_MIN_SAMPLES, shape
        else:
            assert shape["candidate_samples"] == timing.LOSE_MIN_SAMPLES, shape
            assert shape["candidate_slower_than_ms"] == 1e-6, shape


@pytest.mark.gpu
def test_a_retime_in_the_cached_modes_prepares_while_the_gpu_is_shared(
    tmp_path: Path, holds: list[str]
) -> None:
    # With the screening's cache, a re-time knows each shape's timing mode: its inputs, warm-up
    # and graph capture happen under shared holds, a few per shape, and the exclusive hold is
    # samples only. Without it, the modes are chosen from quick timings inside the exclusive
    # hold, where no other process's kernels distort them.
    cache = BaselineCache(tmp_path)
    evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)  # measures them
    n = len(problems.load("softmax").shapes("smoke"))
    holds.clear()

    cached = retime("softmax", [SEED, SEED], device="cuda", tier="smoke", baselines=cache)

    assert all(r["geomean_ms"] for r in cached), cached
    # The first shared hold, then for each shape one before its warm-up and one after it and,
    # in graph mode, one before each of its four captures (two candidates, two baselines).
    assert 1 + 2 * n <= holds.index("exclusive") <= 1 + 6 * n, holds
    assert set(holds[: holds.index("exclusive")]) == {"shared"}, holds
    holds.clear()

    plain = retime("softmax", [SEED, SEED], device="cuda", tier="smoke")

    assert all(r["geomean_ms"] for r in plain), plain
    assert holds.index("exclusive") == 1, holds


class _ProcessChild:
    """What the pump sees of a sandboxed child (its process, and its kill), for the tests of
    its waits: a real process running `code`. With `held` it prints a line once it holds
    what it was written to hold, and this waits for that line."""

    def __init__(self, code: str, *args: str, held: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        if held:
            assert self.proc.stdout.readline().strip() == "held"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def _softmax_run():
    import torch

    from kernels.harness import verdict
    from kernels.harness.evaluation import _seeds

    problem = problems.load("softmax")
    return verdict.Run(problem, "cpu", problem.shapes("smoke")[:1], _seeds(1), torch.float32, None)


def test_a_gpu_slot_is_held_once_per_run_and_its_wait_is_reported() -> None:
    slots = threading.Semaphore(1)
    child = _ProcessChild("import time; time.sleep(60)")
    request = EvaluationRequest(problem="softmax", sources=())
    pump = _Pump(run=None, child=child, request=request, dinfo={}, n_sources=1, slots=slots)
    slots.acquire()  # another evaluation is on the GPU
    threading.Timer(0.3, slots.release).start()

    pump.deadline = time.monotonic() + 100.0  # as `loop` sets it

    pump.take_slot()

    assert pump.slotted and pump.slot_wait >= 0.25, pump.slot_wait
    # The wait is the caller's queue: the child's deadline, for the GPU waits too, moves on.
    assert pump.until == pump.deadline + pump.slot_wait
    assert pump.waited["slot_s"] == pump.slot_wait
    pump.take_slot()  # the child asks again between shapes: the run already holds its slot
    assert pump.slot_wait >= 0.25
    assert not slots.acquire(blocking=False)
    pump.release_slot()
    pump.release_slot()  # given back once, however often the run ends
    assert slots.acquire(blocking=False)
    assert not slots.acquire(blocking=False)
    assert child.proc.poll() is None and not pump.stopped  # a wait within its bound
    child.kill()


def test_the_gpu_slot_goes_to_the_next_evaluation_once_the_child_is_done_with_the_gpu() -> None:
    # After `gpu_done` the child runs nothing more on the GPU; what is left of the run is the
    # caller's check of the timed outputs. The slot is free for the next evaluation by then.
    slots = threading.Semaphore(1)
    child = _ProcessChild("import time; time.sleep(60)")
    request = EvaluationRequest(problem="softmax", sources=())
    pump = _Pump(_softmax_run(), child, request, {}, 1, slots=slots)
    pump.deadline = time.monotonic() + 100.0
    pump.take_slot()
    assert not slots.acquire(blocking=False)

    ended = pump.gpu_done({"t": "gpu_done"})

    assert not ended and not pump.slotted
    assert slots.acquire(blocking=False)  # the next evaluation's
    pump.release_slot()  # the run's end gives nothing back twice
    assert not slots.acquire(blocking=False)
    child.kill()


def test_a_child_holding_the_gpu_slots_itself_is_killed_and_the_wait_ends(tmp_path: Path) -> None:
    # The slots are files any process can flock, a child that got full Python too. Its own
    # evaluation would wait for a slot for ever: past the bound the child is killed, the
    # slot it held comes back, and the run fails `timeout`.
    key = f"test-{tmp_path.name}"
    child = _ProcessChild(
        "import sys, time; from kernels.harness import gpulock; "
        "s = gpulock.GpuSlots(sys.argv[1], 1); s.acquire(); print('held', flush=True); "
        "time.sleep(60)",
        key,
        held=True,
    )
    try:
        run = _softmax_run()
        request = EvaluationRequest(problem="softmax", sources=(), timeout_s=1.0)
        slots = gpulock.GpuSlots(key, 1, poll_s=0.01)
        pump = _Pump(run, child, request, {}, 1, slots=slots)
        started = time.monotonic()

        pump.take_slot()

        assert 0.9 <= time.monotonic() - started < 20
        assert pump.stopped and child.proc.poll() is not None
        assert run.failures == [
            ("timeout", "waited over 1 s for a GPU slot; the process tree was killed")
        ]
        pump.release_slot()
    finally:
        child.kill()


def test_a_child_holding_the_gpu_lock_itself_is_killed_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child may open the GPU lock (it takes it shared to start CUDA) and flock it
    # exclusively: its evaluation waiting for the GPU would wait on it for ever. At the
    # child's deadline it is killed, the lock comes back, and the run fails `timeout`.
    key = f"test-{tmp_path.name}"
    monkeypatch.setattr(gpulock, "gpu_key", lambda: key)
    child = _ProcessChild(
        "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(60)",
        str(gpulock.GpuLock(key).path),
        held=True,
    )
    try:
        run = _softmax_run()
        request = EvaluationRequest(problem="softmax", sources=(), timeout_s=30.0)
        pump = _Pump(run, child, request, {}, 1)
        pump.deadline = time.monotonic() + 1.0  # the child's deadline, as `loop` sets it
        started = time.monotonic()

        pump.take_gpu(shared=True)

        assert 0.9 <= time.monotonic() - started < 20
        assert pump.stopped and child.proc.poll() is not None
        assert run.failures == [
            (
                "timeout",
                "no result within 30 s (it was waiting for the GPU); the process tree was killed",
            )
        ]
        pump.release_gpu()
    finally:
        child.kill()


def test_how_long_the_gpu_lock_was_held_is_reported_per_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An exclusive phase waits for the shared holds in progress to end: how long they are is
    # what the others in flight wait for (the report's gpu_wait).
    monkeypatch.setattr(gpulock, "gpu_key", lambda: f"test-{tmp_path.name}")
    request = EvaluationRequest(problem="softmax", sources=())
    pump = _Pump(run=None, child=None, request=request, dinfo={}, n_sources=1)
    for shared, seconds in ((True, 0.2), (True, 0.05), (False, 0.1)):
        pump.take_gpu(shared=shared)
        time.sleep(seconds)
        pump.release_gpu()
    pump.release_gpu()  # nothing held: nothing counted

    wait = pump.gpu_wait()

    assert wait["holds"] == 3
    assert 0.25 <= wait["held_shared_s"] < 0.25 + 5
    assert 0.2 <= wait["held_shared_max_s"] < wait["held_shared_s"]
    assert 0.1 <= wait["held_exclusive_s"] < 5


def test_without_slots_a_run_reports_no_slot_wait() -> None:
    pump = _Pump(run=None, child=None, request=None, dinfo={}, n_sources=1)

    pump.take_slot()
    pump.release_slot()

    assert not pump.slotted and "slot_s" not in pump.waited


class _RecordedSlots:
    """One GPU slot (`evaluate(..., gpu_slots=)`) that records when each evaluation asked for it,
    got it and gave it back. The test holds it first (`hold`, then `let_go`)."""

    def __init__(self) -> None:
        self._sem = threading.Semaphore(1)
        self._lock = threading.Lock()
        self.asked: list[float] = []
        self.got: list[tuple[float, float]] = []  # (asked, got), in the order they got it
        self.released: list[float] = []

    def acquire(self) -> bool:
        asked = time.monotonic()
        with self._lock:
            self.asked.append(asked)
        self._sem.acquire()
        with self._lock:
            self.got.append((asked, time.monotonic()))
        return True

    def release(self) -> None:
        with self._lock:
            self.released.append(time.monotonic())
        self._sem.release()

    def hold(self) -> None:
        self._sem.acquire()

    def let_go(self) -> float:
        let_go = time.monotonic()
        self._sem.release()
        return let_go


@pytest.mark.gpu
def test_evaluations_beyond_the_gpu_slots_wait_after_compiling(tmp_path: Path) -> None:
    # One slot, two evaluations in flight: both load and compile at once and ask for the slot
    # only then; while one verifies and times, the other waits. The wait is the caller's queue,
    # reported, and both are judged as they would be alone. The test holds the slot until both
    # have asked, so that the second's wait does not depend on how the two compiles overlap.
    cache = BaselineCache(tmp_path)
    evaluate("softmax", SEED, device="cuda", tier="smoke", baselines=cache)  # measures them
    slots = _RecordedSlots()
    slots.hold()

    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(
                evaluate,
                "softmax",
                SEED,
                device="cuda",
                tier="smoke",
                baselines=cache,
                gpu_slots=slots,
            )
            for _ in range(2)
        ]
        deadline = time.monotonic() + 120
        while len(slots.asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(slots.asked) == 2, "both evaluations should have compiled and asked"
        assert not slots.got  # nothing got onto the GPU before compiling ended, for either
        opened = slots.let_go()
        reports = [f.result() for f in futures]

    assert [r["verdict"] for r in reports] == ["accepted", "accepted"], reports
    (asked1, got1), (asked2, got2) = slots.got
    assert got1 >= opened
    assert got2 >= slots.released[0]  # the second got the slot once the first gave it back
    assert asked2 < slots.released[0]  # ... having asked for it while the first held it
    recorded = sorted(round(got - asked, 3) for asked, got in slots.got)
    reported = sorted(r["gpu_wait"]["slot_s"] for r in reports)
    assert reported == pytest.approx(recorded, abs=0.05), (reported, recorded)
    assert len(slots.released) == 2  # both given back


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
