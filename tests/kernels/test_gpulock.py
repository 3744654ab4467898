"""The GPU's lock and slots (kernels.harness.gpulock): flock on temporary files, so no GPU is
needed; the other holders are threads, other processes and a real sandboxed child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernels.harness import landlock, sandbox
from kernels.harness.gpulock import GpuLock, GpuSlots

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lock_key() -> Iterator[str]:
    key = f"test-{uuid.uuid4().hex}"
    yield key
    GpuLock(key).path.unlink(missing_ok=True)
    GpuLock(key).turnstile.unlink(missing_ok=True)
    GpuLock(key).writers.unlink(missing_ok=True)


def _acquire_in_thread(lock: GpuLock) -> threading.Event:
    got = threading.Event()

    def take() -> None:
        lock.acquire()
        got.set()

    threading.Thread(target=take, daemon=True).start()
    return got


def test_an_exclusive_holder_blocks_a_shared_one_until_it_releases(lock_key: str) -> None:
    writer = GpuLock(lock_key).acquire()
    reader = GpuLock(lock_key, shared=True)
    try:
        got = _acquire_in_thread(reader)

        assert not got.wait(0.5)
        writer.release()
        assert got.wait(5)
    finally:
        writer.release()
        reader.release()


def test_a_shared_holder_blocks_an_exclusive_one(lock_key: str) -> None:
    reader = GpuLock(lock_key, shared=True).acquire()
    writer = GpuLock(lock_key)
    try:
        got = _acquire_in_thread(writer)

        assert not got.wait(0.5)
        reader.release()
        assert got.wait(5)
    finally:
        reader.release()
        writer.release()


def test_two_shared_holders_coexist(lock_key: str) -> None:
    first = GpuLock(lock_key, shared=True).acquire()
    second = GpuLock(lock_key, shared=True)
    try:
        assert _acquire_in_thread(second).wait(5)
    finally:
        first.release()
        second.release()


def test_a_waiting_writer_goes_before_readers_that_come_after_it(lock_key: str) -> None:
    # Without the turnstile a reader arriving while the writer waits would be let in beside the
    # first reader, and a stream of such readers would starve the writer (the timing phase).
    first = GpuLock(lock_key, shared=True).acquire()
    writer = GpuLock(lock_key)
    late = GpuLock(lock_key, shared=True)
    try:
        writer_got = _acquire_in_thread(writer)
        time.sleep(0.3)  # the writer is waiting now
        late_got = _acquire_in_thread(late)

        assert not late_got.wait(0.5)
        first.release()
        assert writer_got.wait(5)
        assert not late_got.wait(0.3)
        writer.release()
        assert late_got.wait(5)
    finally:
        first.release()
        writer.release()
        late.release()


def test_timing_phases_go_back_to_back_before_a_waiting_reader(lock_key: str) -> None:
    # A reader waiting while one writer times must not slip in between it and the next writer:
    # each reader let in would have to leave again before that writer could time, so the GPU
    # would drain once per timing phase instead of once per run of them.
    first = GpuLock(lock_key).acquire()
    reader = GpuLock(lock_key, shared=True)
    second = GpuLock(lock_key)
    try:
        reader_got = _acquire_in_thread(reader)
        time.sleep(0.3)  # the reader is waiting now
        second_got = _acquire_in_thread(second)
        time.sleep(0.3)  # and the second writer too

        first.release()
        assert second_got.wait(5)
        assert not reader_got.wait(0.5)
        second.release()
        assert reader_got.wait(5)
    finally:
        first.release()
        second.release()
        reader.release()


def test_a_reader_is_not_held_once_the_writers_let_go(lock_key: str) -> None:
    writer = GpuLock(lock_key).acquire()
    writer.release()
    writer.acquire()
    writer.release()
    reader = GpuLock(lock_key, shared=True)
    try:
        assert _acquire_in_thread(reader).wait(5)
    finally:
        reader.release()


def test_the_lock_works_as_a_context_manager(lock_key: str) -> None:
    other = GpuLock(lock_key, shared=True)
    with GpuLock(lock_key):
        got = _acquire_in_thread(other)
        assert not got.wait(0.3)
    assert got.wait(5)
    other.release()


def test_the_lock_traces_each_hold_when_asked_to(
    lock_key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "locks.txt"
    with GpuLock(lock_key, shared=True, label="check"):
        pass
    assert not trace.exists()  # off unless AUTOWEB_GPU_LOCK_TRACE names a file

    monkeypatch.setenv("AUTOWEB_GPU_LOCK_TRACE", str(trace))
    reader = GpuLock(lock_key, shared=True, label="shared").acquire()
    writer = GpuLock(lock_key, label="exclusive")
    got = _acquire_in_thread(writer)
    assert not got.wait(0.2)
    reader.release()
    assert got.wait(5)
    writer.release()
    lines = [line.split() for line in trace.read_text().splitlines()]
    assert [(x[0], x[1]) for x in lines] == [("shared", "shared"), ("exclusive", "exclusive")]
    # asked, got, released: the writer asked while the reader held, and got it once let go.
    r, w = ([float(v) for v in x[2:]] for x in lines)
    assert r[0] <= r[1] <= w[0] < r[2] <= w[1] <= w[2]


# The sandboxed child's boot, as sandbox._BOOT runs it (early.py by path, its confinement with
# the lock's files, then the package), taking the lock by its path as the runner does for the
# CUDA context; it prints when it asked and got the hold, then lets go.
_CHILD_HOLD = """
import json, sys, time, importlib.util as u
sys.path.insert(0, sys.argv[1])
s = u.spec_from_file_location('autoweb_early', sys.argv[1] + '/kernels/harness/early.py')
m = u.module_from_spec(s); s.loader.exec_module(m); confined = m.prepare()
from kernels.harness import sandbox  # the package, as the runner loads it
from kernels.harness.gpulock import GpuLock
print(json.dumps({"confined": confined}), flush=True)
lock = GpuLock(path=sys.argv[2], shared=True).acquire()
lock.release()
print(json.dumps({"hold": lock.times()}), flush=True)
"""


def test_the_childs_hold_for_its_cuda_context_waits_behind_a_queued_timing_phase(
    lock_key: str, tmp_path: Path
) -> None:
    """A sandboxed child creates its CUDA context under a shared hold taken by the lock's path
    and confined to its directory: it waits for a timing phase that was waiting when it asked,
    as the harness's own shared holds do. A hold straight on the lock file would be let in
    beside the waiting writer (flock favours no one), and a pool's children, starting all the
    time, would keep the timing phase, and every hold queued behind it, off the GPU."""
    reader = GpuLock(lock_key, shared=True).acquire()
    writer = GpuLock(lock_key)
    for f in (writer.path, writer.turnstile, writer.writers):
        f.touch()  # as sandbox.Child does: the confined child may open them, never create them
    got = _acquire_in_thread(writer)
    assert not got.wait(0.2)  # the timing phase waits for the reader
    box = tmp_path / "box"
    box.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "AUTOWEB_CONFINE_DIR": str(box),
        "AUTOWEB_GPU_LOCK": str(writer.path),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_HOLD, str(ROOT), str(writer.path)],
        cwd=box,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        confined = json.loads(child.stdout.readline() or "{}").get("confined")
        assert confined is not None, child.stderr.read()[-2000:]
        time.sleep(0.3)
        assert child.poll() is None  # still waiting: the writer asked first
        reader.release()
        assert got.wait(5)
        time.sleep(0.2)
        writer.release()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-2000:]
    finally:
        reader.release()
        writer.release()
        child.kill()
    asked, held_from, let_go = json.loads(out)["hold"]
    w_asked, w_got, w_released = writer.times()
    assert w_asked < asked and w_released <= held_from <= let_go
    # Where the host has Landlock, the child took its hold confined: the lock's three files
    # are the ones outside its directory that it may open for writing.
    assert confined.get("filesystem") is (landlock.abi_version() >= 1)


class _Stop(Exception):
    pass


def test_the_child_starts_the_cuda_driver_before_its_hold_and_the_context_under_it(
    lock_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's initialisation (cuInit) creates no context and runs nothing on the GPU, so
    the child does it before asking for the hold; torch's CUDA start and the context come under
    it. The order, as kernels.harness.runner.main takes it on a GPU (here the steps record
    themselves, and torch's CUDA start stops the run)."""
    import torch

    from kernels.harness import gpulock, runner

    steps: list[str] = []
    monkeypatch.setattr(runner, "cuda_driver", lambda: steps.append("driver"))
    monkeypatch.setattr(runner, "blocking_sync", lambda cuda: steps.append("sync flag") or True)
    acquire, release = gpulock.GpuLock.acquire, gpulock.GpuLock.release

    def held(self: GpuLock) -> GpuLock:
        steps.append("hold")
        return acquire(self)

    def let_go(self: GpuLock) -> None:
        steps.append("let go")
        release(self)

    def torch_start() -> None:
        steps.append("torch's CUDA start")
        raise _Stop

    monkeypatch.setattr(gpulock.GpuLock, "acquire", held)
    monkeypatch.setattr(gpulock.GpuLock, "release", let_go)
    monkeypatch.setattr(torch.cuda, "init", torch_start)
    monkeypatch.setattr(runner, "_wire", None)  # main opens the wire (below) and sets it
    read, write = os.pipe()
    monkeypatch.setenv("AUTOWEB_WIRE_FD", str(write))
    monkeypatch.setenv("AUTOWEB_DEVICE", "cuda")
    monkeypatch.setenv("AUTOWEB_CUDA_SYNC", "blocking")
    monkeypatch.setenv("AUTOWEB_GPU_LOCK", str(GpuLock(lock_key).path))
    try:
        with pytest.raises(_Stop):
            runner.main({})
    finally:
        os.close(read)
        if runner._wire is not None:
            runner._wire.close()  # the write end
        else:
            os.close(write)
    assert steps == ["driver", "sync flag", "hold", "torch's CUDA start", "let go"]


def test_the_caller_traces_the_hold_a_child_reports_when_it_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child cannot write the trace (no trace file in its environment, and Landlock): it
    says in its "ready" message when its hold was asked for, granted and let go, and the
    caller writes the line. A hold of the wrong form is left out, never traced as garbage."""
    trace = tmp_path / "locks.txt"
    monkeypatch.setenv("AUTOWEB_GPU_LOCK_TRACE", str(trace))
    for hold, traced in (
        ([1.5, 2.25, 3.0], True),
        (None, False),
        ([1.0, 2.0], False),
        ([1.0, "2", 3.0], False),
        ([1.0, float("nan"), 3.0], False),
        ([True, 2.0, 3.0], False),
    ):
        child = sandbox.Child.__new__(sandbox.Child)
        child.ready = False
        child.gpu_hold = None
        child.next = lambda until, hold=hold: {"t": "ready", "confined": {}, "gpu_hold": hold}
        child.wait_ready()
        assert child.ready and (child.gpu_hold is not None) == traced
    assert trace.read_text() == "child-init shared 1.500000 2.250000 3.000000\n"


def test_gpu_slots_are_a_counting_semaphore_across_threads_and_processes(tmp_path: Path) -> None:
    key = f"test-{tmp_path.name}"
    slots = GpuSlots(key, 2, poll_s=0.005)
    held, done = threading.Event(), threading.Event()

    def other_thread() -> None:
        assert slots.try_acquire()
        held.set()
        done.wait(60)
        slots.release()

    helper = threading.Thread(target=other_thread)
    helper.start()
    try:
        assert held.wait(30)
        assert slots.try_acquire()  # the second of two
        # A third, in another process, finds none free: the slots are files, held with flock.
        probe = (
            "from kernels.harness import gpulock; "
            f"print(gpulock.GpuSlots({key!r}, 2).try_acquire())"
        )
        other = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert other.stdout.strip() == "False", other.stderr[-2000:]
        done.set()
        helper.join(30)
        other = subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert other.stdout.strip() == "True", other.stderr[-2000:]  # the thread let go of one
    finally:
        done.set()
        helper.join(30)
        slots.release()


def test_a_gpu_slot_comes_back_when_its_holder_dies(tmp_path: Path) -> None:
    key = f"test-{tmp_path.name}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from kernels.harness import gpulock; "
            f"s = gpulock.GpuSlots({key!r}, 1); s.acquire(); print('held', flush=True); "
            "time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        slots = GpuSlots(key, 1, poll_s=0.005)
        assert not slots.try_acquire()
        holder.kill()
        holder.wait(timeout=30)
        started = time.monotonic()
        assert slots.acquire()
        assert time.monotonic() - started < 5
        slots.release()
    finally:
        holder.kill()


def test_a_gpu_slot_is_released_by_the_thread_that_holds_it() -> None:
    slots = GpuSlots("test-one-thread", 1)
    with pytest.raises(RuntimeError, match="holds no GPU slot"):
        slots.release()
    assert slots.acquire()
    assert slots.try_acquire()  # never given back: the thread still holds it, and keeps it
    slots.release()
    assert slots.try_acquire()
    slots.release()
    with pytest.raises(ValueError, match="at least 1"):
        GpuSlots("test-none", 0)
