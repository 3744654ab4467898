"""The verdict rules rank every failure category the protocol knows, and the message table
handles every message the sandboxed child and the sandbox send."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.harness import childrun, gpulock, sandbox, verdict
from kernels.harness.evaluation import HANDLERS
from kernels.protocol import FAILURES


def test_every_failure_category_has_one_rank_for_when_several_apply():
    assert sorted(verdict.PRIORITY) == sorted(FAILURES)
    assert len(set(verdict.PRIORITY)) == len(verdict.PRIORITY)


def test_the_message_table_handles_every_message_the_child_and_the_sandbox_send():
    text = Path(childrun.__file__).read_text()
    # Messages are sent as send(t="...") or built first as {"t": "...", ...}.
    child = set(re.findall(r'\bt="(\w+)"', text)) | set(re.findall(r'\{"t": "(\w+)"', text))
    own = set(re.findall(r'\{"t": "(\w+)"', Path(sandbox.__file__).read_text()))
    # The patterns still find what they look for (else this test would pass on nothing).
    assert {"verified", "done", "want_gpu"} <= child and {"timeout", "eof"} <= own
    # "ready" is the sandbox's start-up handshake, consumed before a run (Child.wait_ready).
    assert (child | own) - {"ready"} == set(HANDLERS)


def test_a_timed_output_is_checked_against_the_input_set_it_was_computed_on(tmp_path: Path):
    # Graph-mode timing cycles through input sets; the output kept is that of a call picked by
    # the secret seed, on whichever set that call had, and the caller checks it against that
    # set's own reference.
    import torch

    from kernels import problems
    from kernels.harness.evaluation import _seeds

    problem = problems.load("softmax")
    shape = problem.shapes("smoke")[1]
    run = verdict.Run(problem, "cpu", [shape], _seeds(1), torch.float32, None)
    rot = run.seeds[0]["rot"]

    def output(seed: int, tag: str) -> dict:
        inputs = problem.make_inputs(shape, torch.float32, "cpu", seed)
        return childrun.write_tensor(problem.reference(*inputs), tmp_path, tag)

    assert run.verify(0, "timed0", "rot5", output(rot[5 % len(rot)] + 5, "a"), tmp_path)
    assert not run.verify(0, "timed1", "rot5", output(run.seeds[0]["final"], "b"), tmp_path)
    assert not run.verify(0, "timed2", "final", output(rot[5 % len(rot)] + 5, "c"), tmp_path)

    msg = {"t": "timed", "i": 0, "ms": {}, "outputs": {}, "inputs_set": 99}
    verdict.on_timed(run, msg, tmp_path, {}, 1)
    assert run.failures == [
        ("crashed", f"{run.results[0]['label']}: the sandboxed process named an unknown input set")
    ]


@pytest.mark.parametrize(
    ("mode", "inputs_set", "failed"),
    [
        ("events", 0, True),
        ("events", 1, True),
        ("events", 37, True),
        ("events", 64, False),
        ("graph", 0, True),
        ("graph", 5, True),
        ("graph", 37, False),
    ],
)
def test_timed_outputs_must_come_from_the_sample_on_new_values(
    tmp_path: Path, mode: str, inputs_set: int, failed: bool
):
    # The samples all run on the same values, so the output verified is that of one more sample
    # on new values (events: input set timing.EVENTS_INPUT_SET; graph: MAX_INPUT_SETS + the
    # picked call's set): a report naming another set is not the harness's timing speaking,
    # and a captured call that handed back another call's output is results reused.
    import torch

    from kernels import problems
    from kernels.harness import timing
    from kernels.harness.evaluation import _seeds

    problem = problems.load("softmax")
    shape = problem.shapes("smoke")[1]
    run = verdict.Run(problem, "cpu", [shape], _seeds(1), torch.float32, None)
    rot = run.seeds[0]["rot"]
    assert timing.EVENTS_INPUT_SET == 64 and timing.MAX_INPUT_SETS == 32
    seed = rot[inputs_set % len(rot)] + inputs_set if inputs_set else run.seeds[0]["final"]
    out = childrun.write_tensor(
        problem.reference(*problem.make_inputs(shape, torch.float32, "cpu", seed)), tmp_path, "t"
    )
    msg = {"t": "timed", "i": 0, "mode": mode, "ms": {}, "outputs": {"timed0": out},
           "inputs_set": inputs_set}  # fmt: skip
    verdict.on_timed(run, msg, tmp_path, {}, 1)

    label = run.results[0]["label"]
    if failed:
        assert run.failures == [("hack_suspected", f"{label}: timed output not made on new values")]
    else:
        assert ("hack_suspected", f"{label}: timed output not made on new values") not in (
            run.failures
        )
        assert run.results[0]["errors"]["timed0"]["passed"]


def test_a_captured_call_handing_back_another_calls_output_is_results_reused(tmp_path: Path):
    import torch

    from kernels import problems
    from kernels.harness.evaluation import _seeds

    base = torch.zeros(64)
    own = [torch.zeros(8) for _ in range(4)]
    assert not childrun._reuses_a_buffer(own)
    assert childrun._reuses_a_buffer([*own, own[2]])  # the same tensor twice
    assert childrun._reuses_a_buffer([base[:8], base[32:40]])  # views of one storage
    assert not childrun._reuses_a_buffer([torch.zeros(0), torch.zeros(0)])

    problem = problems.load("softmax")
    run = verdict.Run(problem, "cpu", problem.shapes("smoke")[:1], _seeds(1), torch.float32, None)
    msg = {"t": "timed", "i": 0, "mode": "graph", "ms": {}, "outputs": {}, "inputs_set": 40,
           "reused": ["candidate0"]}  # fmt: skip
    verdict.on_timed(run, msg, tmp_path, {}, 1)
    label = run.results[0]["label"]
    assert run.failures == [
        (
            "hack_suspected",
            f"{label}: a captured call returned another call's output (results reused)",
        )
    ]


def test_the_wait_for_a_reference_slot_is_counted():
    # Every evaluation in flight in a process computes its references through a few slots;
    # the report's gpu_wait says how long this one queued there.
    import threading
    import time

    import torch

    from kernels import problems
    from kernels.harness.evaluation import _seeds

    problem = problems.load("softmax")
    run = verdict.Run(problem, "cpu", problem.shapes("smoke")[:1], _seeds(1), torch.float32, None)
    held = 0
    while verdict._REFERENCE_SLOTS.acquire(blocking=False):  # every slot, as busy threads would
        held += 1
    assert held >= 1

    def free() -> None:
        for _ in range(held):
            verdict._REFERENCE_SLOTS.release()

    threading.Timer(0.3, free).start()
    started = time.monotonic()

    run.references(0, ["first"])

    assert run.reference_wait >= 0.25
    assert run.reference_wait <= time.monotonic() - started


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 4), ("", 4), (" ", 4), ("1", 1), ("8", 8), (" 6 ", 6)]
)
def test_the_reference_slots_setting_reads_a_whole_number(raw, expected) -> None:
    assert gpulock.slots_setting("AUTOWEB_REFERENCE_SLOTS", raw, 4) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("0", "AUTOWEB_REFERENCE_SLOTS must be at least 1, got 0"),
        ("-2", "AUTOWEB_REFERENCE_SLOTS must be at least 1, got -2"),
        ("four", "AUTOWEB_REFERENCE_SLOTS must be a whole number, got 'four'"),
        ("2.5", "AUTOWEB_REFERENCE_SLOTS must be a whole number, got '2.5'"),
    ],
)
def test_a_bad_reference_slots_setting_stops_the_process_at_start(raw, message) -> None:
    # 0 used to make a semaphore no reference could ever take: every evaluation then waited
    # for ever. Now loading the verdict rules (a worker does at start) fails, saying why.
    import os
    import subprocess
    import sys

    with pytest.raises(ValueError, match=re.escape(message)):
        gpulock.slots_setting("AUTOWEB_REFERENCE_SLOTS", raw, 4)
    res = subprocess.run(
        [sys.executable, "-c", "import kernels.harness.verdict"],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "AUTOWEB_REFERENCE_SLOTS": raw},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0
    assert message in res.stderr


GIB = 1 << 30


def _memory(total: float, free: float, own: float) -> dict:
    return {"total": int(total * GIB), "free": int(free * GIB), "own": int(own * GIB)}


ASKS_2_GIB = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."


def test_a_process_squeezed_out_by_others_is_crowded_out_not_at_fault():
    why = verdict.crowded_out(ASKS_2_GIB, _memory(80, 0.5, 1.5))

    assert why is not None
    assert "other processes held 78.0 GiB of the GPU's 80.0 GiB" in why
    assert "it held 1.5 GiB and asked for 2.0 GiB more" in why


@pytest.mark.parametrize(
    ("message", "memory", "whose"),
    [
        # It held as much as every other process together: its own hunger.
        (ASKS_2_GIB, _memory(80, 0.5, 40), "hog"),
        (ASKS_2_GIB, _memory(80, 0.5, 79.5), "hog"),
        # What it held and asked for would not fit even on the GPU alone.
        ("CUDA out of memory. Tried to allocate 79.00 GiB.", _memory(80, 30, 1), "too big"),
        ("CUDA out of memory. Tried to allocate 1.5 TiB.", _memory(80, 0, 1), "too big"),
        # No size in the message, and the GPU still had room: nothing tells it was crowded.
        ("CUDA error: out of memory", _memory(80, 4, 1), "unknown"),
        # The child said nothing, or something that does not add up.
        (ASKS_2_GIB, None, "no report"),
        (ASKS_2_GIB, {"total": 80 * GIB, "free": GIB}, "no report"),
        (ASKS_2_GIB, {"total": "80", "free": "x", "own": 1}, "no report"),
        (ASKS_2_GIB, _memory(80, 60, 30), "no report"),  # free + own beyond the total
        (ASKS_2_GIB, _memory(80, -1, 1), "no report"),
        (ASKS_2_GIB, _memory(0, 0, 0), "no report"),
    ],
)
def test_an_out_of_memory_error_stays_the_candidates_own_unless_others_filled_the_gpu(
    message: str, memory: dict | None, whose: str
):
    assert verdict.crowded_out(message, memory) is None, whose


def test_without_a_size_a_full_gpu_of_others_memory_is_crowded():
    assert verdict.crowded_out("CUDA error: out of memory", _memory(80, 0.2, 1)) is not None


def test_the_reason_of_a_candidates_own_out_of_memory_says_what_the_gpu_held():
    assert verdict.gpu_memory_note(_memory(80, 0.5, 70)) == (
        " (the GPU's 80.0 GiB: the sandboxed process held 70.0 GiB, other processes 9.5 GiB, "
        "0.5 GiB free)"
    )
    assert verdict.gpu_memory_note(None) == ""


def test_the_child_reports_the_gpus_memory_for_gpu_out_of_memory_errors_only():
    import torch

    from kernels.harness import runner

    assert runner.gpu_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to ..."))
    assert runner.gpu_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not runner.gpu_out_of_memory(MemoryError())  # the host's memory
    assert not runner.gpu_out_of_memory(RuntimeError("out of memory"))
    assert not runner.gpu_out_of_memory(RuntimeError("CUDA error: an illegal memory access"))


def test_the_lock_trace_names_a_hold_by_the_step_the_child_named():
    from kernels.harness.evaluation import step_label

    assert {step_label(s) for s in childrun.STEPS} == {f"step-{s}" for s in childrun.STEPS}
    # What else the child writes there is its own text: the hold keeps its kind's label.
    for bad in (None, "", 7, "Verify", "x" * 40, "a b", "check\nexclusive", "-x", ["verify"]):
        assert step_label(bad) == "", bad


def _timed_run(tmp_path: Path, mode: str, n: int = 2):
    """A Run of `n` of softmax's smoke shapes whose caller chose shape 0's timing mode, and
    a function that writes the output a right kernel makes on a shape's input set `which`."""
    import torch

    from kernels import problems
    from kernels.harness.evaluation import _seeds

    problem = problems.load("softmax")
    shapes = problem.shapes("smoke")[1 : n + 1]  # (the first, 1x1, has one possible output)
    run = verdict.Run(problem, "cpu", shapes, _seeds(n), torch.float32, None)
    run.timed_plan = {"modes": {"0": mode}, "l2_bytes": 1 << 20}

    def output(i: int, which: str, tag: str) -> dict:
        inputs = run._inputs(i, which)
        return childrun.write_tensor(problem.reference(*inputs), tmp_path, tag)

    return run, output


def _count_oracle(run, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    reference = run._reference

    def counted(i, inputs):
        calls[0] += 1
        return reference(i, inputs)

    monkeypatch.setattr(run, "_reference", counted)
    return calls


@pytest.mark.parametrize("mode", ["events", "graph"])
def test_the_timed_outputs_set_is_predicted_as_the_child_will_pick_it(mode: str, tmp_path: Path):
    from kernels.harness import timing

    run, _ = _timed_run(tmp_path, mode)
    which = run.timed_which(0)
    assert which is not None and which.startswith("rot")
    j = int(which[3:])
    assert timing.is_fresh_set(mode, j)
    if mode == "events":
        assert j == timing.EVENTS_INPUT_SET
    else:
        # What childrun.prepare_shape captures by: the same plan from the same inputs' bytes.
        inputs = run.problem.make_inputs(run.shapes[0], run.dtype, "cpu", run.seeds[0]["final"])
        nsets, reps, pick = timing.graph_plan(1 << 20, timing.inputs_bytes(inputs),
                                              run.seeds[0]["final"])  # fmt: skip
        assert 1 <= pick < reps and j == timing.MAX_INPUT_SETS + pick % nsets
    # Nothing where the caller did not choose the mode, nor for a shape it chose none for.
    assert run.timed_which(1) is None
    run.timed_plan = None
    assert run.timed_which(0) is None


def test_no_timed_reference_is_computed_early_past_the_hosts_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    run, _ = _timed_run(tmp_path, "events")
    numel = run._output_numel(0)
    monkeypatch.setattr(verdict, "TIMED_HOST_BYTES", 8 * numel - 1)
    assert run.timed_which(0) is None
    monkeypatch.setattr(verdict, "TIMED_HOST_BYTES", 8 * numel)
    assert run.timed_which(0) is not None
    # A reference compared on the GPU is computed when its output is checked, not kept.
    monkeypatch.setattr(verdict, "HOST_COMPARE_MAX", numel - 1)
    assert run.timed_which(0) is None
    assert run.verification_references(0, ["first"]) is None
    assert run._for_timed == set() and (0, "first") in run._oracles


def test_a_timed_output_is_checked_against_its_reference_computed_with_the_verified_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    run, output = _timed_run(tmp_path, "events")
    which = run.verification_references(0, ["first"])
    assert which == run.timed_which(0) is not None
    run.references(1, ["first"])  # the next shape's check: shape 0's "first" goes, this stays
    assert (0, which) in run._oracles and (0, "first") not in run._oracles
    calls = _count_oracle(run, monkeypatch)

    j = int(which[3:])
    msg = {"t": "timed", "i": 0, "mode": "events", "ms": {}, "inputs_set": j,
           "outputs": {"timed0": output(0, which, "a")}}  # fmt: skip
    verdict.on_timed(run, msg, tmp_path, {}, 1)

    assert calls[0] == 0  # no reference computed now, so no hold of the GPU taken
    assert run.results[0]["errors"]["timed0"]["passed"], run.results[0]["errors"]
    assert run.timed_early == 1
    assert (0, which) not in run._oracles and run._for_timed_bytes == 0


def test_a_wrong_timed_output_fails_against_the_reference_computed_early(tmp_path: Path):
    run, output = _timed_run(tmp_path, "events")
    which = run.verification_references(0, ["first"])
    # The output of the samples' own values, handed back for the new values' (a kept result).
    msg = {"t": "timed", "i": 0, "mode": "events", "ms": {}, "inputs_set": int(which[3:]),
           "outputs": {"timed0": output(0, "final", "a")}}  # fmt: skip
    verdict.on_timed(run, msg, tmp_path, {}, 1)

    label = run.results[0]["label"]
    assert run.timed_early == 1
    assert not run.results[0]["errors"]["timed0"]["passed"]
    assert any(
        cat == "hack_suspected" and why.startswith(f"{label}: output produced while being timed")
        for cat, why in run.failures
    ), run.failures


def test_a_timed_output_on_another_fresh_set_gets_that_sets_reference_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The prediction only decides what is computed early: a child that names another fresh set
    # (graph timing fell back to events) is checked against that set's reference, computed then.
    from kernels.harness import timing

    run, output = _timed_run(tmp_path, "graph")
    predicted = run.verification_references(0, ["first"])
    calls = _count_oracle(run, monkeypatch)

    named = f"rot{timing.EVENTS_INPUT_SET}"
    assert named != predicted
    msg = {"t": "timed", "i": 0, "mode": "events", "ms": {},
           "inputs_set": timing.EVENTS_INPUT_SET,
           "outputs": {"timed0": output(0, named, "a")}}  # fmt: skip
    verdict.on_timed(run, msg, tmp_path, {}, 1)

    assert calls[0] == 1
    assert "hack_suspected" not in [cat for cat, _ in run.failures], run.failures
    assert run.results[0]["errors"]["timed0"]["passed"]
    assert run.timed_early == 0
    assert (0, predicted) not in run._oracles and run._for_timed_bytes == 0


def _queued(slots: verdict.OldestFirst, n: int) -> None:
    import time

    deadline = time.monotonic() + 10
    while len(slots._waiting) < n:
        assert time.monotonic() < deadline, "the waiters never queued"
        time.sleep(0.01)


def test_the_reference_slots_go_to_the_evaluation_that_began_first():
    # A dozen evaluations that began together each ask once per shape: handed round in the
    # order asked they all finish their checks late together; oldest first, the first is done
    # first and gives its GPU slot to the next. Equal keys: whoever asked first.
    import threading

    slots = verdict.OldestFirst(1)
    assert slots.acquire(0.0)
    order: list[str] = []
    asking = []
    for name, key in (("e5", 5.0), ("e3", 3.0), ("e4-first", 4.0), ("e4-second", 4.0), ("e1", 1.0)):
        t = threading.Thread(
            target=lambda n=name, k=key: (slots.acquire(k), order.append(n), slots.release())
        )
        t.start()
        asking.append(t)
        _queued(slots, len(asking))  # each waits before the next asks
    assert order == []
    slots.release()
    for t in asking:
        t.join(5)
    assert order == ["e1", "e3", "e4-first", "e4-second", "e5"]
    # Bounded: a release without an acquire is a bug.
    assert slots.acquire(2.0, blocking=False)
    assert not slots.acquire(0.0, blocking=False)
    slots.release()
    with pytest.raises(ValueError, match="released more often"):
        slots.release()


def test_two_slots_serve_two_at_once_and_the_next_in_line_takes_the_one_freed():
    import threading

    slots = verdict.OldestFirst(2)
    assert slots.acquire(9.0) and slots.acquire(9.0)
    got = threading.Event()
    t = threading.Thread(target=lambda: (slots.acquire(1.0), got.set()))
    t.start()
    assert not got.wait(0.2)
    slots.release()
    assert got.wait(5)
    t.join(5)
    slots.release()
    slots.release()


def test_a_waiter_interrupted_leaves_the_line_for_those_behind_it(monkeypatch):
    # Ctrl-C lands in the main thread's wait: it must not stay at the head of the line.
    import threading

    slots = verdict.OldestFirst(1)
    assert slots.acquire(0.0)
    real_wait = slots._cond.wait
    calls = {"n": 0}

    def interrupted_once(timeout=None):
        if threading.current_thread() is threading.main_thread() and not calls["n"]:
            calls["n"] += 1
            raise KeyboardInterrupt
        return real_wait(timeout)

    monkeypatch.setattr(slots._cond, "wait", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        slots.acquire(1.0)  # the oldest: it would be served first
    assert slots._waiting == []
    got = threading.Event()
    t = threading.Thread(target=lambda: (slots.acquire(2.0), got.set()))
    t.start()
    slots.release()
    assert got.wait(5)
    t.join(5)
    slots.release()
