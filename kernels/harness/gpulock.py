"""The GPU's lock and slots, shared by every process of a host that uses the GPU.

`GpuLock` is a readers-writer lock per GPU on three files: timing holds it exclusively,
everything else that touches the GPU holds it shared. `GpuSlots` bounds how many evaluations
are on the GPU at once across the worker processes. Both sides use this module: the harness's
processes (kernels.harness.evaluation, kernels.worker) and the sandboxed child, whose CUDA
context is created under a shared hold (kernels.harness.runner): the child reaches it by the
lock's path in AUTOWEB_GPU_LOCK, its TMPDIR being its own. It needs nothing beyond the standard
library (torch only in `gpu_key`), so the child's boot loads it before anything else
(kernels.harness.early), to name the files Landlock lets it open.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

TRACE_ENV = "AUTOWEB_GPU_LOCK_TRACE"


def gpu_key() -> str:
    """Names the visible GPU for the timing lock (its UUID when torch reports one)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    uuid = str(getattr(props, "uuid", ""))
    return uuid or f"{props.name}-{os.environ.get('CUDA_VISIBLE_DEVICES', '0')}"


class GpuLock:
    """Readers-writer lock per GPU across processes (flock): timing holds it exclusively,
    verification and reference computation hold it shared, so nothing else runs on the GPU
    while a candidate is being timed. Each acquisition opens its own file description, so
    threads of one process exclude each other too.

    Writers are not starved: flock alone grants a shared request while a writer waits, so with
    several candidates verifying in turn a timing phase could wait for a gap that never comes.
    Every acquisition first passes a turnstile (a second flock, held only while waiting), and a
    writer holds it until it has the GPU: readers that come after a waiting writer queue behind
    it, readers already in keep the GPU until they are done.

    Timing phases go back to back: a writer announces itself on a third file (shared, from
    asking until it lets go), and a reader first waits until no writer is announced. So readers
    drain from the GPU once for a run of timing phases rather than once before each of them;
    a reader waits for the timing phases queued when it asked, never for ever, since every
    writer lets go once it has timed.

    Every process that touches the GPU takes it this way: the harness's own processes for the
    child's steps, the checks and the timing phases (kernels.harness.evaluation), and the
    sandboxed child for creating its CUDA context (kernels.harness.runner), by the lock's path.

    With `AUTOWEB_GPU_LOCK_TRACE` set to a file, each hold appends a line to it when let go
    (`trace`).
    """

    def __init__(
        self,
        key: str = "",
        shared: bool = False,
        label: str = "",
        *,
        path: str | Path | None = None,
    ) -> None:
        """The lock of the GPU named `key` (`gpu_key`), or the one whose lock file is `path`
        (the sandboxed child's way, given AUTOWEB_GPU_LOCK)."""
        if path is None:
            safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in key)
            path = Path(tempfile.gettempdir()) / f"autoweb-gpu-{safe}.lock"
        self.path = Path(path)
        self.turnstile, self.writers = lock_files(self.path)[1:]
        self.shared = shared
        self.label = "".join(ch for ch in label if ch.isalnum() or ch in "-_") or "-"
        self._fh = None
        self._announced = None
        self._asked = self._got = self.released = 0.0

    def acquire(self) -> GpuLock:
        self._asked = time.monotonic()
        if self.shared:
            with open(self.writers, "a") as announced:
                fcntl.flock(announced, fcntl.LOCK_EX)  # granted once no writer is announced
        else:
            self._announced = open(self.writers, "a")  # noqa: SIM115 - held until released
            fcntl.flock(self._announced, fcntl.LOCK_SH)
        with open(self.turnstile, "a") as gate:
            fcntl.flock(gate, fcntl.LOCK_EX)
            self._fh = open(self.path, "a")  # noqa: SIM115 - held for the lock's lifetime
            fcntl.flock(self._fh, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
        self._got = time.monotonic()
        return self

    def release(self) -> None:
        if self._fh is not None:
            # Read before the unlock: read after it, a writer waiting for this hold could take
            # the lock and stamp its `got` first, and the trace would show the two overlapping.
            self.released = time.monotonic()
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
            kind = "shared" if self.shared else "exclusive"
            trace(self.label, kind, self._asked, self._got, self.released)
        if self._announced is not None:
            fcntl.flock(self._announced, fcntl.LOCK_UN)
            self._announced.close()
            self._announced = None

    def times(self) -> tuple[float, float, float]:
        """When the last hold was asked for, granted and let go (time.monotonic())."""
        return self._asked, self._got, self.released

    def __enter__(self) -> GpuLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def slots_setting(name: str, raw: str | None, default: int | None) -> int | None:
    """A number of slots from the environment variable `name` (its value `raw`): a whole number
    of at least 1, `default` when unset. Raises ValueError with what is wrong (0 slots would
    leave every taker waiting for ever)."""
    if raw is None or not raw.strip():
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be at least 1, got {n}")
    return n


class Slots(Protocol):
    """What bounds the evaluations on a GPU (`evaluate(..., gpu_slots=...)`): a
    `threading.Semaphore` within a process, `GpuSlots` across the processes of a host, or
    either staggered (kernels.engine.flight.Stagger)."""

    def acquire(self) -> bool: ...

    def release(self) -> None: ...


class GpuSlots:
    """At most `n` evaluations past compiling and not yet done with one GPU at once, across the
    processes of a host (the GPU workers of `manage.py up`): a counting semaphore of `n` slot
    files, each held with flock while an evaluation is on the GPU, so a slot comes back by
    itself when its holder dies. The same `acquire`/`release` as a `threading.Semaphore`, which
    a single process (`kernels tune`) passes to `evaluate(..., gpu_slots=...)` instead. A
    thread holds one slot at most and releases the one it acquired; one that acquires while it
    still holds its slot keeps it. Acquisition polls every `poll_s`: no order among waiters."""

    def __init__(self, key: str, n: int, poll_s: float = 0.01) -> None:
        if n < 1:
            raise ValueError(f"GPU slots must be at least 1, got {n}")
        lock = GpuLock(key).path  # beside the GPU's lock: autoweb-gpu-<key>.slot<i>
        self.paths = [lock.with_suffix(f".slot{i}") for i in range(n)]
        for path in self.paths:  # OSError now, not at a candidate's first ask for the GPU
            path.touch(exist_ok=True)
        self.poll_s = poll_s
        self._held = threading.local()

    def try_acquire(self) -> bool:
        if getattr(self._held, "fh", None) is not None:
            # Taken and never given back (the run that took it was interrupted between the two):
            # a thread runs one evaluation at a time, so the slot is this one's.
            return True
        for path in self.paths:
            fh = open(path, "a")  # noqa: SIM115 - held until released
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            self._held.fh = fh
            return True
        return False

    def acquire(self) -> bool:
        while not self.try_acquire():
            time.sleep(self.poll_s)
        return True

    def release(self) -> None:
        fh = getattr(self._held, "fh", None)
        if fh is None:
            raise RuntimeError("this thread holds no GPU slot")
        self._held.fh = None
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def lock_files(path: str | Path) -> tuple[Path, Path, Path]:
    """The lock file at `path` and its turnstile and writers' files beside it."""
    path = Path(path)
    return path, path.with_suffix(".turnstile"), path.with_suffix(".writers")


def trace(label: str, kind: str, asked: float, got: float, released: float) -> None:
    """With AUTOWEB_GPU_LOCK_TRACE set to a file, append the line `label kind asked got
    released` (CLOCK_MONOTONIC seconds, one clock for every process of the host), from which
    `benchmarks/run_phases.py --locks` tells what each timing phase waited for. A sandboxed
    child cannot write it (its environment has no trace file, and Landlock): it reports its
    hold when it is ready, and the caller traces it when it takes the child
    (sandbox.Child.wait_ready), so a pool's child never handed out leaves no line."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = f"{label} {kind} {asked:.6f} {got:.6f} {released:.6f}\n"
    try:
        # One write of one short line to a file opened for appending: lines of several
        # threads and processes do not interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a trace that cannot be written costs the evaluation nothing
