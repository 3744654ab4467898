"""Sandboxed child processes for candidates: isolation, limits, timeouts, a warm pool.

Each candidate gets a fresh Python process that is
- in its own session and process group (killed as a group, with a psutil sweep of the tree),
- under a wall-clock deadline and a memory cap (RLIMIT_AS on the CPU; on CUDA, where the
  driver reserves huge virtual ranges, the parent polls the tree's RSS and kills it),
- given an empty environment except what it needs, its own HOME/TMPDIR/TRITON_CACHE_DIR in a
  private temporary directory, a file-size cap, no core dumps,
- without network when the OS allows it (`unshare -n`, which needs CAP_SYS_ADMIN),
- confined by Landlock where the kernel has it (kernels.harness.landlock): no writes outside
  its directory, no TCP, no signals or abstract Unix sockets aimed outside its own tree,
- unable to create sockets (kernels.harness.seccomp), so no Unix socket or UDP either,
- reporting over a private pipe, never trusted: the parent parses its JSON defensively.
A crash, hang, illegal memory access or OOM ends only that process; a CUDA context poisoned by
a candidate dies with it. Children are started ahead of use (python, torch, triton, device
initialised) but never serve a second candidate.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import BinaryIO

import psutil

from kernels.harness import bytecode, gpulock

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MAX_LINE = 4 << 20
DEFAULT_MEMORY_BYTES = 16 << 30
DEFAULT_FILE_BYTES = 8 << 30
GRACE_S = 5.0

# The child's first line: kernels/harness/early.py by path (before the package's __init__,
# which imports torch, starts any thread), then the runner.
_BOOT = (
    "import sys, importlib.util as u; sys.path.insert(0, sys.argv[1]); "
    "s = u.spec_from_file_location('autoweb_early', sys.argv[1] + '/kernels/harness/early.py'); "
    "m = u.module_from_spec(s); s.loader.exec_module(m); c = m.prepare(); "
    "from kernels.harness.runner import main; main(c)"
)
_PASS_ENV = (
    "AUTOWEB_CUDA_SYNC",  # "blocking": the child's CUDA context blocks while it waits (runner)
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH",
    "TRITON_CUOBJDUMP_PATH",
    "TRITON_NVDISASM_PATH",
    "NVIDIA_VISIBLE_DEVICES",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
)


# What `Child.next` makes up itself; the same types written by the child are garbage.
HARNESS_MESSAGES = frozenset({"timeout", "memory", "disk", "eof", "garbage"})


def open_child_file(path: str | Path) -> BinaryIO:
    """A file in a sandbox's directory, which the child can write, opened for reading only as a
    regular file: never through a symlink it put in its place (to the caller's
    /proc/self/environ, say), never a FIFO or device, which would block or never end. OSError
    otherwise."""
    f = open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb")  # noqa: SIM115
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise OSError(f"{Path(path).name} is not a regular file")
    return f


def read_own_file(path: Path, tail: int | None = None) -> str:
    """The text (its last `tail` bytes) of a file in a sandbox's directory ("" when it is not a
    regular file any more: `open_child_file`)."""
    try:
        f = open_child_file(path)
    except OSError:
        return ""
    with f:
        size = os.fstat(f.fileno()).st_size
        if tail is not None and size > tail:
            f.seek(size - tail)
        return f.read().decode("utf-8", "replace")


class SandboxError(RuntimeError):
    pass


_unshare_ok: bool | None = None


def network_isolation_available() -> bool:
    global _unshare_ok
    if _unshare_ok is None:
        exe = shutil.which("unshare")
        _unshare_ok = False
        if exe and os.environ.get("AUTOWEB_SANDBOX_NETWORK") != "allow":
            with contextlib.suppress(Exception):
                _unshare_ok = (
                    subprocess.run([exe, "-n", "true"], capture_output=True, timeout=10).returncode
                    == 0
                )
    return _unshare_ok


def socket_filter_enabled() -> bool:
    """Whether children refuse to create sockets (kernels.harness.seccomp): on wherever the
    filter is supported, unless `AUTOWEB_SANDBOX_NETWORK=allow`."""
    from kernels.harness import seccomp

    return os.environ.get("AUTOWEB_SANDBOX_NETWORK") != "allow" and seccomp.supported()


def filesystem_confinement_enabled() -> bool:
    """Whether children confine themselves with Landlock (kernels.harness.landlock): on by
    default wherever the kernel has it; `AUTOWEB_SANDBOX_FILESYSTEM=allow` turns it off."""
    from kernels.harness import landlock

    return os.environ.get("AUTOWEB_SANDBOX_FILESYSTEM") != "allow" and landlock.abi_version() > 0


def _scratch_root() -> str | None:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return None


# -I: no PYTHON* variable, user site or working directory counts; -B: no bytecode is written
# (-I ignores PYTHONDONTWRITEBYTECODE). The child reads the bytecode the installed packages came
# with: without it every start compiles their sources again (kernels.harness.bytecode).
PYTHON_FLAGS = ("-I", "-B")


def base_env(directory: Path) -> dict[str, str]:
    """The environment a child starts from, below `directory` (its HOME and caches are made
    there), with what it inherits from this process (_PASS_ENV); Child adds its own wiring."""
    for sub in ("home", "tmp", "triton", "inductor"):
        (directory / sub).mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(directory / "home"),
        "TMPDIR": str(directory / "tmp"),
        "TRITON_CACHE_DIR": str(directory / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(directory / "inductor"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
    return env


class Child:
    """One sandboxed runner process, started warm and used for one candidate."""

    def __init__(
        self,
        device: str,
        *,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        file_bytes: int = DEFAULT_FILE_BYTES,
        per_file_bytes: int | None = None,
        wrapper: list[str] | None = None,
        keep_dir: bool = False,
    ) -> None:
        """`file_bytes` caps the child's directory, all files together (polled);
        `per_file_bytes` (default: the same) caps each file (RLIMIT_FSIZE, exact)."""
        bytecode.ensure()  # once per process: what every child would compile again as it starts
        self.keep_dir = keep_dir
        self.device = device
        self.memory_bytes = memory_bytes
        self.file_bytes = file_bytes
        self.per_file_bytes = per_file_bytes or file_bytes
        self.dir = Path(tempfile.mkdtemp(prefix="autoweb-sbx-", dir=_scratch_root()))
        (self.dir / "out").mkdir()
        r, w = os.pipe()
        env = {
            **base_env(self.dir),
            "AUTOWEB_DEVICE": "cuda" if device == "cuda" else "cpu",
            "AUTOWEB_WIRE_FD": str(w),
            "AUTOWEB_LIMIT_FSIZE": str(self.per_file_bytes),
            "AUTOWEB_LIMIT_NOFILE": "4096",
        }
        if device == "cuda":
            lock_path = gpulock.GpuLock(gpulock.gpu_key()).path
            for path in gpulock.lock_files(lock_path):
                path.touch(exist_ok=True)  # the child may write to them, never create beside
            env["AUTOWEB_GPU_LOCK"] = str(lock_path)
        if socket_filter_enabled() and not wrapper:
            env["AUTOWEB_DENY_SOCKETS"] = "1"  # kernels/harness/seccomp.py
        if filesystem_confinement_enabled() and not wrapper:
            # Not under a profiler (`kernels profile`): its injected library writes its own
            # files and talks to the profiler; the report then says the child was not confined.
            # The child confines itself at boot (kernels/harness/early.py): writes only below.
            env["AUTOWEB_CONFINE_DIR"] = str(self.dir)
        if device == "interpret":
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["AUTOWEB_LIMIT_AS"] = str(memory_bytes)
        cmd = [*(wrapper or []), sys.executable, *PYTHON_FLAGS, "-c", _BOOT, str(PROJECT_ROOT)]
        if wrapper:
            env["PATH"] = os.environ.get("PATH", env["PATH"])  # the profiler finds its tools
        if network_isolation_available():
            cmd = ["unshare", "-n", "--", *cmd]
        self.log_path = self.dir / "child.log"
        _LIVE.add(self)  # before it starts: a sweep in another thread must never take it
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(w,),
                env=env,
                cwd=self.dir / "tmp",
                start_new_session=True,
            )
        os.close(w)
        self.started = time.monotonic()
        self._msgs: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(r,), daemon=True)
        self._reader.start()
        self.ready = False
        self.confined: dict = {}
        self.cuda_sync: str | None = None  # on a GPU: how its CUDA context waits (runner)
        # On a GPU: when the shared hold its CUDA context was created under was asked for,
        # granted and let go (time.monotonic(), one clock for the host's processes).
        self.gpu_hold: tuple[float, float, float] | None = None
        self._dead_since: float | None = None
        self.peak_rss = 0
        self._ps: psutil.Process | None = None

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            while True:
                line = f.readline(MAX_LINE)
                if not line:
                    break
                try:
                    msg = json.loads(line)
                    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
                        raise ValueError("not a message")
                    if msg["t"] in HARNESS_MESSAGES:  # only this side may say so
                        raise ValueError("a message only the harness makes")
                except ValueError:
                    msg = {"t": "garbage", "raw": line[:200].decode("utf-8", "replace")}
                self._msgs.put(msg)
        self._msgs.put({"t": "eof"})

    def send(self, obj: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def cpu_seconds(self) -> float | None:
        """CPU seconds the sandboxed process has used so far, the children it has reaped (a
        compiler it ran) included, read from /proc by this process, never reported by the
        child. None once it is gone. (Under a profiler's wrapper: the wrapper's.)"""
        try:
            if self._ps is None:
                self._ps = psutil.Process(self.proc.pid)
            t = self._ps.cpu_times()
        except psutil.Error:
            return None
        return round(t.user + t.system + t.children_user + t.children_system, 3)

    def _rss(self) -> int:
        total = 0
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(self.proc.pid)
            for q in [p, *p.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += q.memory_info().rss
        return total

    def next(self, deadline: float) -> dict:
        """The next message, or a synthetic 'timeout' / 'memory' message."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"t": "timeout"}
            try:
                return self._msgs.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None:
                    # Dead, but the wire may not close: a process it started holds the pipe's
                    # write end. What it wrote before dying has been read by now.
                    if self._dead_since is None:
                        self._dead_since = time.monotonic()
                    elif time.monotonic() - self._dead_since > 0.5:
                        return {"t": "eof"}
                rss = self._rss()
                self.peak_rss = max(self.peak_rss, rss)
                if rss > self.memory_bytes:
                    return {"t": "memory", "rss": rss}
                # RLIMIT_FSIZE caps each file; this caps them all (the directory may be RAM).
                disk = self._disk()
                if disk > self.file_bytes:
                    return {"t": "disk", "bytes": disk}

    def _disk(self) -> int:
        total = 0
        stack = [str(self.dir)]
        while stack:
            with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
                for e in it:
                    with contextlib.suppress(OSError):
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        elif e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_blocks * 512
        return total

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if self.ready:
            return
        msg = self.next(time.monotonic() + timeout_s)
        if msg.get("t") != "ready":
            self.kill()
            raise SandboxError(f"sandbox failed to start: {msg.get('t')}: {self.log_tail()}")
        confined = msg.get("confined")
        # Told by the child before any candidate code ran, so it can be believed.
        self.confined = confined if isinstance(confined, dict) else {}
        sync = msg.get("cuda_sync")
        self.cuda_sync = sync if sync in ("auto", "blocking") else None
        hold = msg.get("gpu_hold")
        if (
            isinstance(hold, list)
            and len(hold) == 3
            and all(type(t) in (int, float) and math.isfinite(t) for t in hold)
        ):
            # The shared hold its CUDA context was created under, traced here (the child
            # cannot write the trace): asked for, granted, let go.
            self.gpu_hold = tuple(float(t) for t in hold)
            gpulock.trace("child-init", "shared", *self.gpu_hold)
        self.ready = True

    def log_tail(self, n: int = 3000) -> str:
        return read_own_file(self.log_path, n)

    def exit_description(self) -> str:
        rc = self.proc.poll()
        if rc is None:
            return "still running"
        if rc < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-rc).name}"
        return f"exit code {rc}"

    def kill(self) -> None:
        # While the child (a subreaper) lives, orphans of its descendants stay in its tree.
        with contextlib.suppress(psutil.Error):
            _stop_and_kill([psutil.Process(self.proc.pid)])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=GRACE_S)

    def close(self) -> None:
        self.kill()
        _LIVE.discard(self)
        sweep_escaped()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _stop_and_kill(roots: list[psutil.Process]) -> None:
    """Stop these processes and everything below them, then kill them all. Stopping first
    matters: a stopped process cannot fork, so the sweep converges even against a fork loop."""
    tree: dict[int, psutil.Process] = {}
    for _ in range(100):
        new = []
        for root in roots:
            with contextlib.suppress(psutil.Error):
                new += [q for q in [root, *root.children(recursive=True)] if q.pid not in tree]
        if not new:
            break
        for q in new:
            tree[q.pid] = q
            with contextlib.suppress(psutil.Error):
                q.suspend()
    for q in tree.values():
        with contextlib.suppress(psutil.Error):
            q.kill()


# ---- processes that outlived their sandbox process ---------------------------------------
#
# While a child lives it is a subreaper, so whatever a candidate starts stays in its tree and
# Child.kill sweeps it. A candidate that kills its own sandbox process (possible only past the
# static checks) leaves its processes to the nearest subreaper above: with
# adopt_escaped_processes() that is this process, which then recognises them by the seccomp
# filter every sandboxed process carries (one more than this process has) and kills them.

_LIVE: weakref.WeakSet[Child] = weakref.WeakSet()


def kill_all() -> None:
    """Kill every sandboxed process this process started (and what they started): for a caller
    that is being stopped, so that no candidate outlives it."""
    for child in list(_LIVE):
        if hasattr(child, "proc"):
            child.kill()


_adopting = False


def adopt_escaped_processes() -> bool:
    """Make this process a subreaper, so processes escaping a dead sandbox come to it and
    sweep_escaped() can kill them. For a long-lived process that only starts sandboxes (the
    GPU worker, the CLI): it also inherits any other orphaned grandchild. Returns whether the
    escaped ones can be recognised (the sandbox's seccomp filter is on)."""
    global _adopting
    from kernels.harness.early import become_subreaper

    if not _adopting:
        if not become_subreaper():
            return False
        _adopting = True
    return socket_filter_enabled()


def _seccomp_filters(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Seccomp_filters:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def sweep_escaped() -> int:
    """Kill this process's children that came from a sandbox (they carry more seccomp filters
    than this process) but are no live sandbox's own process, with their trees. Returns how
    many trees it killed. Without adopt_escaped_processes() there are none to find."""
    if not _adopting:
        return 0
    mine = _seccomp_filters(os.getpid()) or 0
    killed = 0
    for _ in range(20):  # killing a tree re-parents its stragglers here: go again
        runners = {c.proc.pid for c in list(_LIVE) if hasattr(c, "proc")}
        found: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process().children():
                n = _seccomp_filters(p.pid)
                if p.pid not in runners and n is not None and n > mine:
                    found.append(p)
        if not found:
            break
        _stop_and_kill(found)
        for p in found:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p.pid, 0)  # ours now: reap it
        killed += len(found)
    return killed


class Pool:
    """Keeps `size` warm children per device ready, idle: each is handed out once, and each
    taken is replaced in the background (the children in use are not counted). `first`, when
    larger, is how many start at once: a caller that begins several evaluations together takes
    that many warm ones, and only `size` are kept idle after. Each warm child has started
    Python and torch and, on a GPU, holds a CUDA context: its share of the GPU's memory."""

    def __init__(self, device: str, size: int = 2, first: int | None = None, **child_kw) -> None:
        self.device = device
        self.size = max(0, size)
        self.child_kw = child_kw
        self._idle: list[Child] = []
        self._lock = threading.Lock()
        self.first = max(self.size, first or 0)  # how many started at once
        self._fill_to(self.first)

    def fill(self) -> None:
        self._fill_to(None)

    def _fill_to(self, n: int | None) -> None:
        """Up to n idle (None: `size`, read under the lock, so a closed pool starts none)."""
        with self._lock:
            while len(self._idle) < (self.size if n is None else n):
                self._idle.append(Child(self.device, **self.child_kw))

    def acquire(self) -> Child:
        with self._lock:
            child = self._idle.pop(0) if self._idle else None
        if child is None or child.proc.poll() is not None:
            if child is not None:
                child.close()
            child = Child(self.device, **self.child_kw)
        threading.Thread(target=self.fill, daemon=True).start()
        return child

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self.size = 0
        for c in idle:
            c.close()
