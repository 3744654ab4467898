"""Hostile candidates against the sandbox's run-time layer, with real processes.

Each fixture here is rejected by the static checks already (test_integrity.py proves that);
these tests switch the static checks off to show that the OS-level limits hold on their own:
processes the candidate starts are killed (even a double-forked daemon in a new session), files
are capped, writes outside the candidate's directory and signals to its worker are refused
(Landlock), and no socket can be made (seccomp) or reach anything (network namespace). After
each fault, the whole process tree is gone within the timeout plus the sandbox's grace period,
and the same pool (what a worker uses) still evaluates the softmax seed correctly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kernels.harness import evaluate, landlock
from kernels.harness.sandbox import (
    GRACE_S,
    Pool,
    filesystem_confinement_enabled,
    network_isolation_available,
    socket_filter_enabled,
)

ROOT = Path(__file__).resolve().parents[2]
EXPLOITS = ROOT / "tests" / "fixtures" / "exploits"
SEED = (ROOT / "kernels" / "seeds" / "softmax.py").read_text()
FILE_CAP = 64 << 20
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    """One warm child at a time, as `python -m kernels.worker` keeps; small file caps. Each file
    is capped at half the directory's cap, so one growing file meets RLIMIT_FSIZE first
    whatever else the directory holds and however late the directory is polled (a loaded
    machine); many small files meet the directory cap."""
    p = Pool(
        "interpret",
        size=1,
        file_bytes=FILE_CAP,
        per_file_bytes=FILE_CAP // 2,
        memory_bytes=3 << 30,
    )
    try:
        yield p
    finally:
        p.close()


def _warm(pool: Pool) -> None:
    """Wait for the pool's next child, so the timed part is the candidate's alone."""
    pool.fill()
    for c in list(pool._idle):
        c.wait_ready()


def _in_sandbox(p: psutil.Process, sandbox_dir: str) -> bool:
    with contextlib.suppress(psutil.Error):
        if p.cwd().startswith(sandbox_dir):
            return True
    with contextlib.suppress(psutil.Error):
        return p.environ().get("TMPDIR", "").startswith(sandbox_dir)
    return False


def _gone(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() != create_time or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _evaluate_watched(
    pool: Pool | None, source: str, device: str = "interpret", **kw
) -> tuple[dict, float, dict]:
    """Evaluate with static checks off while recording every descendant process we see."""
    if pool is not None:
        _warm(pool)
    me = psutil.Process()
    seen: dict[int, tuple[float, str, str]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    # A forked child shows its parent's command line until it execs, so keep
                    # every command line a pid shows, not only the first one we catch.
                    cmd = " ".join(p.cmdline())[:200]
                    if p.pid not in seen:
                        seen[p.pid] = (p.create_time(), cmd, p.cwd())
                    elif cmd not in seen[p.pid][1]:
                        t, cmds, cwd = seen[p.pid]
                        seen[p.pid] = (t, f"{cmds} | {cmd}", cwd)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        report = evaluate(
            "softmax",
            source,
            device=device,
            pool=pool,
            skip_static_checks=True,
            timeout_s=kw.pop("timeout_s", TIMEOUT_S),
            **kw,
        )
    finally:
        elapsed = time.monotonic() - started
        stop.set()
        watcher.join()
    return report, elapsed, seen


def _assert_tree_gone(report: dict, seen: dict) -> None:
    sandbox_dir = report["sandbox_dir"]
    ours = {pid: t for pid, (t, _, cwd) in seen.items() if cwd.startswith(sandbox_dir)}
    assert ours, "the watcher never saw the sandboxed process"
    alive = [pid for pid, t in ours.items() if not _gone(pid, t)]
    assert not alive, f"still running: {[seen[p][1] for p in alive]}"
    survivors = [
        (p.pid, p.name())
        for p in psutil.process_iter()
        if p.pid != psutil.Process().pid and _in_sandbox(p, sandbox_dir)
    ]
    assert not survivors, f"processes from {sandbox_dir} survived: {survivors}"
    assert not Path(sandbox_dir).exists()


def _assert_serves_the_seed(pool: Pool) -> None:
    report = evaluate("softmax", SEED, device="interpret", pool=pool)
    assert report["verdict"] == "accepted", report["reasons"]


def _reasons(report: dict) -> str:
    return " ".join(report["reasons"]).lower()


# ---- processes ----------------------------------------------------------------------------


def test_a_candidate_that_leaves_processes_running_is_rejected_and_they_are_killed(
    pool: Pool,
) -> None:
    source = (EXPLOITS / "fork_children.py").read_text()

    report, elapsed, seen = _evaluate_watched(pool, source)

    assert report["failure"] == "prohibited", report["reasons"]
    assert "process(es) still running" in _reasons(report), report["reasons"]
    assert any("sleep 60" in cmd for _, cmd, _ in seen.values()), "the candidate never forked"
    assert elapsed < TIMEOUT_S
    _assert_tree_gone(report, seen)
    _assert_serves_the_seed(pool)


def test_a_hanging_candidate_with_a_daemon_in_its_own_session_is_killed_whole(
    pool: Pool,
) -> None:
    # The daemon left the sandbox's process group and session, and its parent exited: only
    # the child's subreaper flag keeps it in the tree the kill sweeps.
    source = (EXPLOITS / "fork_children.py").read_text()
    source = re.sub(r"\n    return y\n?$", "\n    while True:\n        pass\n", source)
    timeout_s = 15.0

    report, elapsed, seen = _evaluate_watched(pool, source, timeout_s=timeout_s)

    assert report["failure"] == "timeout", report["reasons"]
    assert any("sleep 600" in cmd for _, cmd, _ in seen.values()), (
        "no daemon seen in the tree (it escaped, or never started)"
    )
    assert elapsed < timeout_s + GRACE_S
    _assert_tree_gone(report, seen)
    _assert_serves_the_seed(pool)


@pytest.mark.gpu
def test_on_cuda_a_kernel_that_runs_on_is_stopped_before_the_gpu_and_killed_whole() -> None:
    # The same daemon and endless loop on CUDA: the child's compile-only pass calls the kernel
    # on meta tensors first and stops the call at its bound on the candidate's own CPU time
    # (kernels.harness.childrun.HostClock), long before the timeout, and what the candidate
    # started is killed with it.
    source = (EXPLOITS / "fork_children.py").read_text()
    source = re.sub(r"\n    return y\n?$", "\n    while True:\n        pass\n", source)

    timeout_s = 2 * TIMEOUT_S
    report, elapsed, seen = _evaluate_watched(
        None, source, device="cuda", tier="smoke", timeout_s=timeout_s
    )

    assert report["failure"] == "timeout", report["reasons"]
    assert "outside triton's compiler" in _reasons(report), report["reasons"]
    assert "on shape 0 (" in _reasons(report), report["reasons"]
    assert any("sleep 600" in cmd for _, cmd, _ in seen.values()), "no daemon seen in the tree"
    # Stopped by the bound, not the timeout (whose reason says "no result within"). The wall
    # time says little: on an H100 host running eight test processes the bound's 10 CPU
    # seconds, the child's start and its first compile once took 50 s.
    assert elapsed < timeout_s
    _assert_tree_gone(report, seen)


_WORKER_SCRIPT = """
import json, sys, time
import psutil
from kernels.harness import evaluate
from kernels.harness.sandbox import adopt_escaped_processes

adopted = adopt_escaped_processes() if sys.argv[2] == "adopt" else False
report = evaluate("softmax", open(sys.argv[1]).read(), device="interpret",
                  skip_static_checks=True)
time.sleep(0.5)
print(json.dumps({"adopted": adopted, "failure": report["failure"],
                  "reasons": report["reasons"]}))
"""


def _sleepers(tag: str) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] == ["sleep", tag] and p.status() != psutil.STATUS_ZOMBIE
    ]


def _run_as_worker(tmp_path: Path, adopt: bool) -> tuple[dict, list[psutil.Process]]:
    """Evaluate kill_own_sandbox in a separate process standing in for the worker; returns its
    verdict and the candidate's daemons still running afterwards."""
    tag = str(uuid.uuid4().int % 10**6 + 10**6)  # a sleep of its own, to find it by
    source = (EXPLOITS / "kill_own_sandbox.py").read_text()
    source = source.replace('SLEEP = "613"', f"SLEEP = {tag!r}")
    path = tmp_path / "candidate.py"
    path.write_text(source)
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_SCRIPT, str(path), "adopt" if adopt else "no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), _sleepers(tag)


def test_a_candidate_that_kills_its_own_sandbox_leaves_nothing_running(tmp_path: Path) -> None:
    if not socket_filter_enabled():
        pytest.skip("escaped processes are recognised by the seccomp filter, absent here")
    # Control: a process that does not adopt shows the escape is real (the daemon outlives it).
    report, left = _run_as_worker(tmp_path, adopt=False)
    try:
        assert report["failure"] == "crashed", report["reasons"]
        assert left, "the fixture's daemon never started or did not escape: the test proves nothing"
    finally:
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()

    report, left = _run_as_worker(tmp_path, adopt=True)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()

    assert report["adopted"] is True
    assert report["failure"] == "crashed", report["reasons"]
    assert "killed by sigkill" in _reasons(report), report["reasons"]
    assert not left, "the daemon outlived the sandbox it escaped from"


# ---- files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "mention"),
    [
        ("fill_disk", "file too large"),  # RLIMIT_FSIZE: the write fails with EFBIG
        ("fill_disk_many", "disk full"),  # many files under the cap: the directory cap
    ],
)
def test_a_candidate_that_fills_the_disk_is_stopped_at_the_cap(
    pool: Pool, fixture: str, mention: str
) -> None:
    report, elapsed, seen = _evaluate_watched(pool, (EXPLOITS / f"{fixture}.py").read_text())

    assert report["failure"] == "crashed", report["reasons"]
    assert mention in _reasons(report), report["reasons"]
    assert elapsed < TIMEOUT_S
    _assert_tree_gone(report, seen)
    _assert_serves_the_seed(pool)


def _write_outside_source(target: Path) -> str:
    source = (EXPLOITS / "write_outside.py").read_text()
    return source.replace('"/tmp/autoweb-write-outside-canary"', repr(str(target)))


def test_the_static_checks_stop_a_write_outside_the_sandbox_before_it_runs(
    tmp_path: Path,
) -> None:
    target = tmp_path / f"canary-{uuid.uuid4().hex}"

    report = evaluate("softmax", _write_outside_source(target), device="interpret")

    assert report["failure"] == "prohibited"
    assert not target.exists()


def test_without_static_checks_a_candidate_still_cannot_write_outside_its_directory(
    pool: Pool, tmp_path: Path
) -> None:
    if not filesystem_confinement_enabled():
        pytest.skip("this kernel has no Landlock: the run-time layer cannot confine writes")
    target = tmp_path / f"canary-{uuid.uuid4().hex}"

    report, elapsed, seen = _evaluate_watched(pool, _write_outside_source(target))

    assert report["verdict"] == "rejected", "the candidate wrote outside its directory"
    assert report["failure"] == "crashed", report["reasons"]
    assert "permission denied" in _reasons(report), report["reasons"]
    assert report["sandbox"]["filesystem_confined"] is True
    assert not target.exists()
    assert elapsed < TIMEOUT_S
    _assert_tree_gone(report, seen)
    _assert_serves_the_seed(pool)


def test_the_child_may_write_its_own_proc_files_but_not_another_process(pool: Pool) -> None:
    # The CUDA driver writes below the child's own /proc/<pid>, so that much is allowed; the
    # same file of another process (here: this test's) stays out of reach.
    if not filesystem_confinement_enabled():
        pytest.skip("this kernel has no Landlock: the run-time layer cannot confine writes")

    def writes(path: str) -> str:
        return _write_outside_source(Path(path)).replace(
            "torch.os.O_WRONLY | torch.os.O_CREAT", "torch.os.O_WRONLY"
        )

    comm = Path(f"/proc/{os.getpid()}/comm")
    before = comm.read_text()
    own, _, _ = _evaluate_watched(pool, writes("/proc/self/comm"))
    assert own["verdict"] == "accepted", own["reasons"]

    report, elapsed, seen = _evaluate_watched(pool, writes(str(comm)))

    assert report["failure"] == "crashed", report["reasons"]
    assert "permission denied" in _reasons(report), report["reasons"]
    assert comm.read_text() == before
    _assert_tree_gone(report, seen)


def test_the_socket_filter_covers_threads_started_before_it() -> None:
    # The child installs the filter after the CUDA driver has started its threads: every one of
    # them must refuse sockets too (seccomp's TSYNC), not only the thread that installed it.
    if not socket_filter_enabled():
        pytest.skip("the socket filter is not supported on this platform")
    code = """
import socket, threading
from kernels.harness import seccomp
go, done, seen = threading.Event(), threading.Event(), []
def early():
    go.wait()
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
        seen.append("open")
    except OSError as e:
        seen.append(e.strerror)
    done.set()
t = threading.Thread(target=early)
t.start()
assert seccomp.deny_sockets()
go.set(); done.wait(10)
print(seen[0])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Permission denied", out.stdout


def test_without_static_checks_a_candidate_cannot_signal_its_worker(pool: Pool) -> None:
    if not filesystem_confinement_enabled() or landlock.abi_version() < 6:
        pytest.skip("this kernel's Landlock cannot scope signals (ABI < 6)")
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    try:
        report, elapsed, seen = _evaluate_watched(pool, (EXPLOITS / "signal_worker.py").read_text())
        time.sleep(0.2)  # a signal that got through is delivered by now
    finally:
        signal.signal(signal.SIGUSR2, previous)

    assert not got, "the candidate signalled the process that runs it"
    assert report["failure"] == "crashed", report["reasons"]
    assert "operation not permitted" in _reasons(report), report["reasons"]
    assert report["sandbox"]["confinement"]["signals"] is True
    assert elapsed < TIMEOUT_S
    _assert_tree_gone(report, seen)
    _assert_serves_the_seed(pool)


# ---- network ------------------------------------------------------------------------------


def _reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _listening(host: str, port: int) -> Iterator[None]:
    """Make sure something accepts connections at host:port from this process, so a refusal
    inside the sandbox is the sandbox's doing, not an empty port."""
    if _reachable(host, port):
        yield
        return
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    try:
        assert _reachable(host, port)
        yield
    finally:
        srv.close()


def _host_address() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _refusal(report: dict) -> str:
    """What refusing a connection looks like with the layers this host gave the child: the
    socket filter refuses socket(2) itself; without it, Landlock refuses a TCP connect; a
    network namespace alone makes every address unreachable."""
    if report["sandbox"]["sockets_denied"]:
        return "permission denied"
    if report["sandbox"]["confinement"].get("tcp"):
        return "permission denied"
    return "network is unreachable"


@pytest.mark.parametrize("fixture", ["socket_redis", "socket_postgres", "socket_remote"])
def test_a_candidate_cannot_open_a_socket(pool: Pool, fixture: str) -> None:
    if not (network_isolation_available() or socket_filter_enabled()):
        pytest.skip(
            "neither unshare -n nor the socket filter works here: children share the network"
        )
    source = (EXPLOITS / f"{fixture}.py").read_text()
    host = re.search(r'^HOST = "(.+)"$', source, re.MULTILINE).group(1)
    port = int(re.search(r"^PORT = (\d+)$", source, re.MULTILINE).group(1))
    if fixture == "socket_remote":
        # An address that is not loopback but that this host can reach: its own interface.
        host = _host_address()
        if host is None:
            pytest.skip("this machine has no non-loopback IPv4 address to aim at")
        port = _free_port(host)
        source = re.sub(r'^HOST = ".+"$', f'HOST = "{host}"', source, flags=re.MULTILINE)
        source = re.sub(r"^PORT = \d+$", f"PORT = {port}", source, flags=re.MULTILINE)

    with _listening(host, port):
        report, elapsed, seen = _evaluate_watched(pool, source)

    assert report["verdict"] == "rejected", "the candidate reached the network"
    assert report["failure"] == "crashed", report["reasons"]
    assert _refusal(report) in _reasons(report), report["reasons"]
    assert elapsed < TIMEOUT_S
    _assert_tree_gone(report, seen)
    _assert_serves_the_seed(pool)


def test_a_candidate_cannot_reach_a_unix_socket(pool: Pool, tmp_path: Path) -> None:
    # A pathname socket is reachable from any network namespace: only the socket filter stops
    # it. The test listens on its own socket, so a refusal is the sandbox's doing.
    if not socket_filter_enabled():
        pytest.skip("the socket filter is not supported on this platform")
    path = tmp_path / "s.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    srv.settimeout(0.5)
    source = (EXPLOITS / "socket_unix.py").read_text()
    source = re.sub(r'^PATH = ".+"$', f"PATH = {str(path)!r}", source, flags=re.MULTILINE)
    try:
        report, elapsed, seen = _evaluate_watched(pool, source)
        with pytest.raises(TimeoutError):
            srv.accept()[0].close()  # nothing connected
    finally:
        srv.close()

    assert report["verdict"] == "rejected", "the candidate reached the Unix socket"
    assert report["failure"] == "crashed", report["reasons"]
    assert "permission denied" in _reasons(report), report["reasons"]
    assert report["sandbox"]["sockets_denied"] is True
    assert elapsed < TIMEOUT_S
    _assert_tree_gone(report, seen)
    _assert_serves_the_seed(pool)


# ---- the same confinement under CUDA ------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("fixture", "mention"),
    [
        ("write_outside", "permission denied"),
        ("socket_unix", "permission denied"),
        ("signal_worker", "operation not permitted"),
    ],
)
def test_the_confinement_holds_on_cuda_and_honest_kernels_still_pass(
    fixture: str, mention: str, tmp_path: Path
) -> None:
    """Landlock and the socket filter with the CUDA driver loaded: the driver opens its device
    nodes read-write and the seed must still be accepted, while the fixture is refused."""
    if not (filesystem_confinement_enabled() and socket_filter_enabled()):
        pytest.skip("this host gives the child neither Landlock nor the socket filter")
    target = tmp_path / "canary"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(tmp_path / "s.sock"))
    srv.listen(4)
    source = (EXPLOITS / f"{fixture}.py").read_text()
    source = source.replace('"/tmp/autoweb-write-outside-canary"', repr(str(target)))
    source = re.sub(
        r'^PATH = ".+"$', f"PATH = {str(tmp_path / 's.sock')!r}", source, flags=re.MULTILINE
    )
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    try:
        report = evaluate("softmax", source, device="cuda", tier="smoke", skip_static_checks=True)
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
        srv.close()

    assert report["failure"] == "crashed", report["reasons"]
    assert mention in _reasons(report), report["reasons"]
    assert not target.exists() and not got
    seed = evaluate("softmax", SEED, device="cuda", tier="smoke")
    assert seed["verdict"] == "accepted", seed["reasons"]
    assert seed["sandbox"]["filesystem_confined"] is True
    assert seed["sandbox"]["sockets_denied"] is True
