"""The caller's checks of the child's verified outputs: in order, on a thread of their own while
the child goes on, each holding the GPU (shared) for its own work alone, after a reference slot,
and settled before anything reads their verdict."""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kernels import problems
from kernels.harness import childrun, evaluate, gpulock, sandbox, verdict
from kernels.harness.evaluation import _Pump, _seeds
from kernels.protocol import EvaluationRequest, HarnessFault

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "kernels" / "seeds" / "softmax.py").read_text()
WRONG = SEED.replace("y.to(y_ptr", "(y * 1.5).to(y_ptr", 1)  # every output half again too large


@pytest.fixture
def lock_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    key = f"test-checks-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(gpulock, "gpu_key", lambda: key)
    yield key
    lock = gpulock.GpuLock(key)
    for path in (lock.path, lock.turnstile, lock.writers):
        path.unlink(missing_ok=True)


def _run(n_shapes: int = 1, first: int = 0) -> verdict.Run:
    problem = problems.load("softmax")
    shapes = problem.shapes("smoke")[first : first + n_shapes]
    return verdict.Run(problem, "cpu", shapes, _seeds(len(shapes)), torch.float32, None)


def test_the_checks_run_in_order_on_a_thread_of_their_own(monkeypatch: pytest.MonkeyPatch):
    seen: list[tuple[str, int]] = []
    real = verdict.on_verified

    def spy(run, msg, root) -> None:
        seen.append((threading.current_thread().name, msg["i"]))
        real(run, msg, root)

    monkeypatch.setattr(verdict, "on_verified", spy)
    report = evaluate("softmax", SEED, device="interpret", tier="smoke")

    assert report["verdict"] == "accepted", report["reasons"]
    assert [i for _, i in seen] == list(range(len(report["shapes"])))
    assert all(name.startswith("autoweb-checks") for name, _ in seen)
    assert threading.current_thread().name not in {name for name, _ in seen}


def test_a_wrong_output_is_still_rejected_once_the_checks_settle():
    assert WRONG != SEED
    report = evaluate("softmax", WRONG, device="interpret", tier="smoke")
    assert report["verdict"] == "rejected"
    assert report["failure"] == "incorrect"
    assert report["checks"]["correctness"]["passed"] is False


def test_a_check_that_raises_ends_the_run_with_its_error(monkeypatch: pytest.MonkeyPatch):
    def broken(run, msg, root) -> None:
        raise RuntimeError("reference unavailable")

    monkeypatch.setattr(verdict, "on_verified", broken)
    report = evaluate("softmax", SEED, device="interpret", tier="smoke")

    assert report["verdict"] == "rejected"
    assert report["failure"] == "crashed"
    assert any(
        "the 'verified' message from the sandboxed process could not be handled: "
        "RuntimeError: reference unavailable" in r
        for r in report["reasons"]
    ), report["reasons"]


def test_a_check_takes_its_reference_slot_before_the_gpu_and_compares_on_the_host_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A check waiting for a reference slot while it held the GPU would keep a timing phase
    # waiting; a small reference compared under the hold would keep it longer than its GPU
    # work. The order of what a check enters and leaves says which.
    run = _run()
    events: list[str] = []
    slot = run.reference_slot

    @contextlib.contextmanager
    def reference_slot(nbytes: int = 0) -> Iterator[None]:
        with slot(nbytes):
            events.append("slot")
            yield
            events.append("/slot")

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        events.append("gpu")
        yield
        events.append("/gpu")

    real_compare = verdict.compare

    def compare(out, ref, tol):
        events.append("compare")
        return real_compare(out, ref, tol)

    monkeypatch.setattr(run, "reference_slot", reference_slot)
    monkeypatch.setattr(verdict, "compare", compare)
    run.gpu_hold = hold
    inputs = run.problem.make_inputs(run.shapes[0], run.dtype, "cpu", run.seeds[0]["first"])
    meta = childrun.write_tensor(run.problem.reference(*inputs), tmp_path, "first")

    assert run.verify(0, "first", "first", meta, tmp_path)
    # The reference under one hold (its shape checks the output file before a byte is read),
    # then the comparison, on the host, the GPU let go.
    assert events == ["slot", "gpu", "/gpu", "/slot", "compare"]
    assert run.oracle(0, "first").device.type == "cpu"


def _outputs(run: verdict.Run, root: Path, whichs: dict[str, str], wrong: str = "") -> dict:
    """The child's output files for shape 0: tag -> the inputs (a seed's name) it was made on,
    the output `wrong` made on the other inputs."""
    outs = {}
    for tag, which in whichs.items():
        seed = run.seeds[0]["first" if tag == wrong else which]
        if tag == wrong and which == "first":
            seed = run.seeds[0]["second"]
        inputs = run.problem.make_inputs(run.shapes[0], run.dtype, "cpu", seed)
        outs[tag] = childrun.write_tensor(run.problem.reference(*inputs), root, tag)
    return outs


def _counting(run: verdict.Run) -> list[str]:
    holds: list[str] = []

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        holds.append("gpu")
        yield

    run.gpu_hold = hold
    return holds


def test_a_shapes_three_verified_outputs_take_one_hold_for_their_references(tmp_path: Path):
    # The first call, the call on new values and the graph replay: their three references are
    # computed under one hold of the GPU, not one each, and each output is still compared with
    # its own.
    run = _run(first=1)
    run.dev = "cuda"  # the graph replay's output is checked on a GPU only; the work stays here
    holds = _counting(run)
    whichs = {"first": "first", "second": "second", "graph": "final"}
    msg = {"t": "verified", "i": 0, "facts": {}, "outputs": _outputs(run, tmp_path, whichs)}

    verdict.on_verified(run, msg, tmp_path)

    assert holds == ["gpu"]
    assert run.failures == []
    assert [run.results[0]["errors"][t]["passed"] for t in whichs] == [True] * 3
    assert run.checks["correctness"]["passed"] and run.checks["cuda_graph"]["passed"]


def test_an_output_made_on_other_inputs_still_fails_its_own_reference(tmp_path: Path):
    # One hold for the three references must not mix them up: a replay that returns the first
    # call's result, not the new inputs', is caught (on a shape whose output the inputs move).
    run = _run(first=1)
    run.dev = "cuda"
    whichs = {"first": "first", "second": "second", "graph": "final"}
    outs = _outputs(run, tmp_path, whichs, wrong="graph")

    verdict.on_verified(run, {"t": "verified", "i": 0, "facts": {}, "outputs": outs}, tmp_path)

    assert run.checks["correctness"]["passed"] is True
    assert run.checks["cuda_graph"]["passed"] is False
    assert [c for c, _ in run.failures] == ["hack_suspected"]


def _short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict, "MEMORY_RETRY_WAITS_S", (0.01, 0.02, 0.03))


def test_a_reference_that_runs_the_caller_out_of_memory_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Other evaluations' references and every candidate's process share the GPU: this
    # process running out of memory is no fault of the candidate, and passes once memory frees.
    _short_waits(monkeypatch)
    run = _run()
    holds = _counting(run)
    real = problems.Problem.oracle
    failing = iter([True, True])

    def oracle(self, *inputs):
        if next(failing, False):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.95 GiB")
        return real(self, *inputs)

    outs = _outputs(run, tmp_path, {"first": "first"})
    monkeypatch.setattr(problems.Problem, "oracle", oracle)

    assert run.verify(0, "first", "first", outs["first"], tmp_path)
    assert holds == ["gpu"] * 3
    assert run.failures == []
    assert sum("ran out of memory" in n and "tried again" in n for n in run.notes) == 2


def test_a_caller_out_of_memory_every_time_is_the_harness_fault_never_a_verdict(
    monkeypatch: pytest.MonkeyPatch,
):
    # Past its retries the run raises HarnessFault: no report, so nothing is rejected
    # `crashed` on the caller's account, and the child is gone.
    _short_waits(monkeypatch)
    softmax = problems.load("softmax")

    def oracle(self, *inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.95 GiB")

    monkeypatch.setattr(problems.Problem, "oracle", oracle)

    with pytest.raises(HarnessFault, match=r"ran out of memory.*tried 4 times.*not judged"):
        evaluate(softmax, SEED, device="interpret", tier="smoke")
    assert all(c.proc.poll() is not None for c in list(sandbox._LIVE) if hasattr(c, "proc"))


GIB = 1 << 30
# The child's report when it ran out of GPU memory (runner.gpu_memory): on an 80 GiB GPU, other
# processes held nearly all of it, or it held most of it itself.
SQUEEZED = {"total": 80 * GIB, "free": GIB // 2, "own": 3 * GIB // 2}
HOG = {"total": 80 * GIB, "free": GIB // 2, "own": 70 * GIB}
ASKS_2_GIB = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."


def test_a_child_squeezed_out_of_gpu_memory_by_others_is_a_fault_never_a_verdict():
    # Other evaluations' sandboxes had filled the GPU: the candidate is not judged, and the
    # run raises HarnessFault once the child is gone (`run`), to be run again.
    pump = _Pump(_run(), None, EvaluationRequest("softmax", (SEED,)), {}, 1)

    assert pump.error({"t": "error", "message": ASKS_2_GIB, "gpu_memory": SQUEEZED}) is True
    assert pump.run.failures == []
    assert isinstance(pump.fault, HarnessFault)
    assert "other processes held 78.0 GiB" in str(pump.fault)
    assert str(pump.fault).endswith("the candidate was not judged")


@pytest.mark.parametrize("memory", [HOG, None], ids=["held-most-of-it", "no-report"])
def test_a_child_out_of_gpu_memory_on_its_own_account_is_crashed(memory: dict | None):
    pump = _Pump(_run(), None, EvaluationRequest("softmax", (SEED,)), {}, 1)
    msg = {"t": "error", "message": ASKS_2_GIB, **({"gpu_memory": memory} if memory else {})}

    assert pump.error(msg) is True
    assert pump.fault is None
    [(category, why)] = pump.run.failures
    assert category == "crashed" and why.startswith("out of memory: OutOfMemoryError")
    assert ("the sandboxed process held 70.0 GiB" in why) == (memory is not None)


def _graph_capture_out_of_memory(memory: dict) -> tuple[verdict.Run, dict]:
    problem = problems.load("softmax")
    shapes = problem.shapes("smoke")[:1]
    run = verdict.Run(problem, "cuda", shapes, _seeds(1), torch.float32, None)
    facts = {"graph_error": ASKS_2_GIB, "graph_memory": memory}
    return run, {"t": "verified", "i": 0, "outputs": {}, "facts": facts}


def test_a_graph_capture_squeezed_out_of_gpu_memory_is_a_fault_never_a_verdict(tmp_path: Path):
    run, msg = _graph_capture_out_of_memory(SQUEEZED)

    with pytest.raises(HarnessFault, match=r"CUDA-graph capture: .* other processes held 78.0"):
        verdict.on_verified(run, msg, tmp_path)
    assert run.failures == []


def test_a_graph_capture_out_of_gpu_memory_on_its_own_account_is_crashed(tmp_path: Path):
    run, msg = _graph_capture_out_of_memory(HOG)

    verdict.on_verified(run, msg, tmp_path)

    [(category, why)] = run.failures
    assert category == "crashed" and "out of memory during CUDA-graph capture" in why
    assert "the sandboxed process held 70.0 GiB" in why


def test_any_other_error_of_a_reference_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _short_waits(monkeypatch)
    run = _run()
    holds = _counting(run)
    meta = _outputs(run, tmp_path, {"first": "first"})["first"]

    def oracle(self, *inputs):
        raise KeyError("x")

    monkeypatch.setattr(problems.Problem, "oracle", oracle)

    with pytest.raises(KeyError):
        run.verify(0, "first", "first", meta, tmp_path)
    assert holds == ["gpu"]


def test_a_check_holds_the_gpu_shared_on_its_own_and_waits_for_a_timing_phase(lock_key: str):
    pump = _Pump(_run(), None, EvaluationRequest("softmax", (SEED,)), {}, 1)
    timing = gpulock.GpuLock(lock_key).acquire()
    entered = threading.Event()
    leave = threading.Event()

    def check() -> None:
        with pump.check_hold():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=check)
    t.start()
    assert not entered.wait(0.3), "a check ran while the GPU was held for timing"
    timing.release()
    assert entered.wait(10)
    # While the check holds the GPU, a timing phase waits for it.
    second = gpulock.GpuLock(lock_key)
    got = threading.Event()
    threading.Thread(target=lambda: (second.acquire(), got.set()), daemon=True).start()
    assert not got.wait(0.3), "a timing phase began while a check held the GPU"
    leave.set()
    t.join(10)
    assert got.wait(10)
    second.release()
    waited = pump.gpu_wait()
    assert waited["holds"] == 1
    # Counted as a check's, apart from the child's shared holds.
    assert waited["check_s"] >= 0.25 and waited["held_check_s"] >= 0.25
    assert waited["held_check_max_s"] == waited["held_check_s"]
    assert waited["shared_s"] == waited["held_shared_s"] == 0


def test_the_child_hold_is_given_up_before_the_checks_settle(lock_key: str):
    # The child's hold, a timing phase asking after it, and a check asking after that: the
    # check waits for the timing phase, which waits for the child's hold. Settling the checks
    # while keeping that hold would wait for ever; the pump gives it up first.
    pump = _Pump(_run(), None, EvaluationRequest("softmax", (SEED,)), {}, 1)
    pump.lock = gpulock.GpuLock(lock_key, shared=True).acquire()
    timing = gpulock.GpuLock(lock_key)
    timed = threading.Event()

    def time_alone() -> None:
        timing.acquire()
        timed.set()
        timing.release()

    threading.Thread(target=time_alone, daemon=True).start()
    _wait_for(lambda: _announced(lock_key), 10)
    checked = threading.Event()

    def a_check(msg) -> None:
        with pump.check_hold():
            checked.set()

    pump._checks = concurrent.futures.ThreadPoolExecutor(1, "autoweb-checks")
    pump._pending.append(pump._checks.submit(a_check, {}))
    with pytest.raises(AssertionError, match="child's hold is kept"):
        pump.settle_checks()
    pump.release_gpu()
    pump.settle_checks(close=True)
    assert timed.wait(10) and checked.is_set()


def _announced(key: str) -> bool:
    """Whether a timing phase has announced itself on the lock (`GpuLock`'s writers file)."""
    with open(gpulock.GpuLock(key).writers, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _wait_for(cond, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_evaluations_in_flight_together_each_get_their_own_verdict():
    # Several evaluations in one process (as `kernels tune --jobs` keeps them), each with its
    # thread of checks, sharing the process's reference slots: every verdict is its own.
    sources = [SEED, WRONG, SEED]
    with concurrent.futures.ThreadPoolExecutor(len(sources)) as pool:
        reports = list(
            pool.map(lambda s: evaluate("softmax", s, device="interpret", tier="smoke"), sources)
        )

    assert [r["verdict"] for r in reports] == ["accepted", "rejected", "accepted"], [
        r["reasons"] for r in reports
    ]
    assert reports[1]["failure"] == "incorrect"
    assert not any(t.name.startswith("autoweb-checks") for t in threading.enumerate())


def test_the_reference_memory_is_handed_out_first_come_first_served():
    # A large reference waiting for memory is not overtaken by small ones that would fit: it
    # goes as soon as the memory is back, and they go after it.
    budget = verdict.MemoryBudget(100)
    order: list[str] = []
    first = budget.take(60)
    first.__enter__()

    def take(name: str, nbytes: int, hold: float) -> threading.Thread:
        def go() -> None:
            with budget.take(nbytes):
                order.append(name)
                time.sleep(hold)

        t = threading.Thread(target=go)
        t.start()
        return t

    big = take("big", 90, 0.2)
    time.sleep(0.1)
    small = take("small", 10, 0)  # would fit beside the first; waits behind the big one
    time.sleep(0.1)
    assert order == [] and budget.used == 60
    first.__exit__(None, None, None)
    big.join(5)
    small.join(5)
    assert order == ["big", "small"]
    assert budget.used == 0


def test_a_request_above_the_whole_budget_runs_alone():
    budget = verdict.MemoryBudget(100)
    with budget.take(10**12):
        assert budget.used == 100
    with budget.take(-5):
        assert budget.used == 0


def test_a_reference_is_reckoned_at_its_problems_float64_bytes():
    run = _run(first=1)
    assert run.reference_bytes(0) == 0  # on the host: no GPU memory to share
    run.pdev = "cuda"
    shape = run.shapes[0]
    expected = verdict.REFERENCE_MEMORY_FACTOR * run.problem.bytes(shape, torch.float64)
    assert run.reference_bytes(0) == int(expected) > 0


# ---- references computed ahead, while the child loads and compiles -------------------------


def _messages(run: verdict.Run, root: Path, i: int, wrong: str = "") -> dict:
    """The child's `verified` report of shape i: its three outputs, `wrong` made on other
    inputs."""
    outs = {}
    for tag, which in (("first", "first"), ("second", "second"), ("graph", "final")):
        seed = run.seeds[i]["second" if tag == wrong and which != "second" else which]
        if tag == wrong and which == "second":
            seed = run.seeds[i]["first"]
        inputs = run.problem.make_inputs(run.shapes[i], run.dtype, "cpu", seed)
        outs[tag] = childrun.write_tensor(run.problem.reference(*inputs), root, f"{tag}{i}")
    return {"t": "verified", "i": i, "facts": {}, "outputs": outs}


def test_a_shapes_references_computed_ahead_are_the_ones_its_check_uses(tmp_path: Path):
    # Computed ahead: one hold for the shape's three, none when its report is checked, the
    # outputs still each compared with their own inputs' reference, and freed once checked.
    run = _run(n_shapes=2, first=1)
    run.dev = "cuda"
    holds = _counting(run)

    assert run.reference_ahead(0) and run.reference_ahead(1)
    assert holds == ["gpu", "gpu"] and run.ahead_computed == 6
    verdict.on_verified(run, _messages(run, tmp_path, 0), tmp_path)
    run.checked(0)
    verdict.on_verified(run, _messages(run, tmp_path, 1, wrong="graph"), tmp_path)
    run.checked(1)

    assert holds == ["gpu", "gpu"]  # the checks computed nothing
    assert [run.results[0]["errors"][t]["passed"] for t in ("first", "second", "graph")] == [
        True
    ] * 3
    assert run.results[1]["errors"]["graph"]["passed"] is False  # made on the first inputs
    assert [c for c, _ in run.failures] == ["hack_suspected"]
    assert run._ahead == set() and run._ahead_bytes == 0
    assert not any(k in run._oracles for k in [(0, "first"), (0, "second"), (0, "final")])


def test_references_ahead_outlive_another_shapes_check_until_their_own(tmp_path: Path):
    # A check of shape 0 computes its own references; those computed ahead for shape 1 stay.
    run = _run(n_shapes=2, first=1)
    holds = _counting(run)
    assert run.reference_ahead(1)

    verdict.on_verified(run, _messages(run, tmp_path, 0), tmp_path)
    run.checked(0)

    assert (1, "first") in run._oracles and (1, "final") in run._oracles
    assert run.reference_ahead(0)  # already checked: nothing computed for it
    assert holds == ["gpu", "gpu"]  # shape 1 ahead, shape 0 at its check
    verdict.on_verified(run, _messages(run, tmp_path, 1), tmp_path)
    assert holds == ["gpu", "gpu"] and not run.failures


def test_references_ahead_skip_large_outputs_and_stop_at_their_bytes(
    monkeypatch: pytest.MonkeyPatch,
):
    run = _run(n_shapes=2)
    holds = _counting(run)

    monkeypatch.setattr(verdict, "HOST_COMPARE_MAX", 0)  # compared on the GPU: not kept
    assert run.reference_ahead(0) is True
    monkeypatch.setattr(verdict, "HOST_COMPARE_MAX", 1 << 20)
    monkeypatch.setattr(verdict, "AHEAD_HOST_BYTES", 1)
    assert run.reference_ahead(0) is False  # the bytes are spent: no more ahead
    monkeypatch.setattr(run.problem.module, "reference", _raises)
    monkeypatch.setattr(verdict, "AHEAD_HOST_BYTES", 1 << 30)
    assert run.reference_ahead(1) is True  # no size on meta tensors: left to the check

    assert holds == [] and run.ahead_computed == 0 and not run._oracles


def _raises(*inputs):
    raise RuntimeError("no meta support")


def _spy_ahead(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Records when references were computed ahead and when reports were checked, with the
    references ahead on (off by default) unless the test set it."""
    if "AUTOWEB_REFERENCES_AHEAD" not in os.environ:
        monkeypatch.setenv("AUTOWEB_REFERENCES_AHEAD", "1")
    events: list[tuple[str, int]] = []
    ahead, on_verified = verdict.Run.reference_ahead, verdict.on_verified

    def spy_ahead(self, i: int) -> bool:
        before = self.ahead_computed
        go = ahead(self, i)
        if self.ahead_computed > before:
            events.append(("ahead", i))
        return go

    def spy_verified(run, msg, root) -> None:
        events.append(("check", msg["i"]))
        on_verified(run, msg, root)

    monkeypatch.setattr(verdict.Run, "reference_ahead", spy_ahead)
    monkeypatch.setattr(verdict, "on_verified", spy_verified)
    return events


def test_an_evaluation_computes_its_references_ahead_and_each_once(
    monkeypatch: pytest.MonkeyPatch,
):
    events = _spy_ahead(monkeypatch)
    computed: list[int] = []
    oracle = verdict.Run.oracle

    def spy_oracle(self, i: int, which: str):
        if (i, which) not in self._oracles:
            computed.append(i)
        return oracle(self, i, which)

    monkeypatch.setattr(verdict.Run, "oracle", spy_oracle)
    report = evaluate("softmax", SEED, device="interpret", tier="smoke")

    assert report["verdict"] == "accepted", report["reasons"]
    n = len(report["shapes"])
    assert [i for kind, i in events if kind == "check"] == list(range(n))
    assert events[0] == ("ahead", 0)  # before the child had verified anything
    # Every shape's three references computed once, ahead or at its check, never both.
    assert sorted(computed) == sorted([i for i in range(n) for _ in range(3)])


def test_a_wrong_output_is_rejected_with_its_references_computed_ahead(
    monkeypatch: pytest.MonkeyPatch,
):
    events = _spy_ahead(monkeypatch)
    report = evaluate("softmax", WRONG, device="interpret", tier="smoke")

    assert ("ahead", 0) in events
    assert report["verdict"] == "rejected" and report["failure"] == "incorrect"


def test_references_ahead_can_be_turned_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AUTOWEB_REFERENCES_AHEAD", "0")
    events = _spy_ahead(monkeypatch)
    report = evaluate("softmax", SEED, device="interpret", tier="smoke")

    assert report["verdict"] == "accepted", report["reasons"]
    assert events and all(kind == "check" for kind, _ in events)


def test_references_ahead_are_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AUTOWEB_REFERENCES_AHEAD", raising=False)
    assert not verdict.references_ahead_enabled()
    monkeypatch.setenv("AUTOWEB_REFERENCES_AHEAD", "yes")
    assert not verdict.references_ahead_enabled()
    monkeypatch.setenv("AUTOWEB_REFERENCES_AHEAD", "1")
    assert verdict.references_ahead_enabled()
