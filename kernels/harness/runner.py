"""The sandboxed child: loads one candidate, runs it, reports raw observations.

It never decides a verdict. The parent computes the float64 reference itself and compares
the outputs this process writes; this process only reports what it saw (outputs, aliasing,
mutated inputs, torch ops the candidate called, tampering, timings). Protocol: JSON lines on
fd 3 to the parent, one JSON line of instructions on stdin.

Started warm: it imports torch and triton and initialises the device before it is given a
candidate, so a pool of idle children saves start-up time; each child serves one candidate.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import traceback
import warnings

_wire = None


def kill_descendants() -> int:
    """Stop, then kill, every process below this one; returns how many were running.

    Stopping first matters: a stopped process cannot fork, so the sweep converges even
    against a fork loop. Zombies (already exited, not yet reaped) are not counted.
    """
    import contextlib

    import psutil

    me = psutil.Process()
    seen: dict[int, psutil.Process] = {}
    running = 0
    for _ in range(100):
        new = [p for p in me.children(recursive=True) if p.pid not in seen]
        if not new:
            break
        for p in new:
            seen[p.pid] = p
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    running += 1
                p.suspend()
    for p in seen.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    return running


def send(**msg) -> None:
    _wire.write(json.dumps(msg, default=str) + "\n")
    _wire.flush()


def _send_sweeping(**msg) -> None:
    """`send`, except that the final message first kills and counts processes the candidate
    left running (once this process exits they would no longer be anyone's descendants)."""
    if msg.get("t") == "done":
        msg["strays"] = kill_descendants()
    send(**msg)


def cuda_driver() -> ctypes.CDLL | None:
    """The CUDA driver, initialised (`cuInit`), or None where it does not load or initialise
    (torch then says why when it needs the GPU). Initialising creates no context and runs
    nothing on the GPU, so it needs no hold of the GPU's lock: done first, outside it, the
    hold covers torch's CUDA start, the context's creation and its first allocation."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return cuda if cuda.cuInit(0) == 0 else None


def blocking_sync(cuda: ctypes.CDLL | None) -> bool:
    """Have this process's CUDA context block on a synchronisation primitive while it waits for
    the GPU (`AUTOWEB_CUDA_SYNC=blocking`) rather than spin on a core, which CUDA's own choice
    does with fewer contexts than cores. A dozen sandboxes verify at once on one GPU, each
    waiting on kernels of the others; spinning, they take cores that could compile the next
    candidates. Timings are taken with CUDA events, on the GPU, so how the host waits does not
    enter them. Called with the initialised driver (`cuda_driver`) before the context exists;
    False where there is none or it refuses (the context then makes CUDA's own choice)."""
    if cuda is None:
        return False
    dev = ctypes.c_int()
    if cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return False
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None)
    set_flags = set_flags or cuda.cuDevicePrimaryCtxSetFlags
    return set_flags(dev, ctypes.c_uint(4)) == 0  # CU_CTX_SCHED_BLOCKING_SYNC


def gpu_out_of_memory(e: BaseException) -> bool:
    """The GPU's memory ran out: torch's OutOfMemoryError, or CUDA's own "out of memory" error.
    Host memory running out (MemoryError) is not this."""
    import torch

    if isinstance(e, torch.OutOfMemoryError):
        return True
    text = str(e).lower()
    return "out of memory" in text and "cuda" in text


def gpu_memory() -> dict | None:
    """The GPU's memory as this process sees it when it has run out of it, in bytes: the
    device's `total` and `free`, and what this process's allocator holds (`own`: the
    candidate's tensors and the harness's, including those the failed call still refers to).
    The caller tells from it whether other processes had filled the GPU
    (`kernels.harness.verdict.crowded_out`). None where the device cannot say."""
    import torch

    try:
        free, total = torch.cuda.mem_get_info()
        return {"total": int(total), "free": int(free), "own": int(torch.cuda.memory_reserved())}
    except Exception:
        return None


def recv() -> dict:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)
    return json.loads(line)


def main(confined: dict | None = None) -> None:
    """`confined`: what kernels.harness.early applied before this package (and torch) loaded."""
    global _wire
    _wire = os.fdopen(int(os.environ["AUTOWEB_WIRE_FD"]), "w", buffering=1)
    warnings.simplefilter("ignore")
    import torch

    # torch.compile loads here, in every child, although only one that compiles the
    # torch.compile baseline calls it: its import rebinds torch.manual_seed, so it must come
    # before the tamper snapshot, and torch loads it anyway at a candidate's first tensor op
    # (the op recorder is a TorchDispatchMode, whose dispatch torch wraps to keep dynamo out).
    # Loaded later, it would read as tampering: a child that skipped it failed candidates.
    import torch._dynamo  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    device = os.environ.get("AUTOWEB_DEVICE", "cpu")
    sync = None  # how the CUDA context waits for the GPU: "auto" (CUDA's choice) or "blocking"
    hold = None  # when the hold for the CUDA context was asked for, granted and let go
    if device == "cuda":
        driver = cuda_driver()  # outside the hold: it creates no context
        sync = "auto"
        if os.environ.get("AUTOWEB_CUDA_SYNC") == "blocking" and blocking_sync(driver):
            sync = "blocking"
        # Creating a CUDA context disturbs a kernel being timed in another process: take the
        # GPU's lock shared, as verification does, so it waits while anyone is timing. Taken
        # as every shared hold is (kernels.harness.gpulock), it also waits for the timing
        # phases queued when it asked: a pool's children start all the time, and none of them
        # keeps a waiting timing phase, and every evaluation queued behind it, off the GPU.
        from kernels.harness.gpulock import GpuLock

        lock = GpuLock(path=os.environ["AUTOWEB_GPU_LOCK"], shared=True)
        with lock:
            torch.cuda.init()
            torch.empty(1, device="cuda")
            torch.cuda.synchronize()
        hold = [round(t, 6) for t in lock.times()]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    confined = dict(confined or {})
    if os.environ.get("AUTOWEB_DENY_SOCKETS") == "1":
        # The device is up (the CUDA driver needs a socket while it initialises) and nothing of
        # the candidate's has loaded: refuse sockets from here on, on every thread. A failure
        # is fatal, as for Landlock: no candidate runs believing it is confined when it is not.
        from kernels.harness import seccomp

        confined["sockets_denied"] = seccomp.deny_sockets()
    send(t="ready", pid=os.getpid(), confined=confined, cuda_sync=sync, gpu_hold=hold)
    spec = recv()
    try:
        from kernels.harness import childrun

        childrun.run(spec, _send_sweeping, recv)
    except SystemExit:
        raise
    except BaseException as e:  # the candidate may raise anything, incl. KeyboardInterrupt
        kill_descendants()
        memory = gpu_memory() if device == "cuda" and gpu_out_of_memory(e) else None
        send(
            t="error",
            category=_categorise(e),
            message=_msg(e),
            tb=traceback.format_exc()[-4000:],
            **({"gpu_memory": memory} if memory else {}),
        )
        _wire.flush()
        os._exit(1)
    _wire.flush()
    os._exit(0)  # skip interpreter teardown: a candidate's atexit/finalisers never run


def _msg(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:2000]


def _categorise(e: BaseException) -> str:
    name = type(e).__name__
    text = str(e)
    if name == "HostCodeTooLong":  # kernels.harness.childrun.HostClock stopped the candidate
        return "timeout"
    if "CompilationError" in name or "CompileTimeAssertionFailure" in name:
        return "compile_error"
    # The CPU interpreter raises language-level errors (what the GPU compiler would reject)
    # at run time, wrapped in InterpreterError.
    if name == "InterpreterError" and "memory" not in text.lower():
        return "compile_error"
    return "crashed"


if __name__ == "__main__":
    main()
