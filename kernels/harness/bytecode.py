"""The installed packages' compiled bytecode, which every sandboxed child reads as it starts.

A child runs `python -I -B` (kernels.harness.sandbox): it writes no bytecode, so a package
installed without any (uv's default, `pip install --no-compile`) is compiled from its sources
again by every child that starts. On an H100 host whose torch, triton, numpy and sympy came
that way, a child's start-up cost 8.7-12.3 CPU seconds; with their bytecode in place, importing
torch took 1.95 CPU seconds instead of 3.7 and torch._dynamo 1.2 instead of 4.3
(docs/benchmarks/search.md). A screening host starts dozens of children a minute.

So before its first child starts, a process compiles what is missing, once, as pip does when
it installs: `python -m compileall` in a process of its own, over each package directory that
has no bytecode for this interpreter and that this user may write. It says on stderr what it
compiled; for a directory it may not write, it gives the command for whoever owns it.
`AUTOWEB_COMPILE_BYTECODE=0` leaves the packages as they are (the message stays).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# What a child loads as it starts (kernels.harness.runner): torch, torch.compile (which brings
# sympy and mpmath), triton, numpy.
PACKAGES = ("torch", "triton", "numpy", "sympy", "mpmath")

_lock = threading.Lock()
_checked = False


def _pyc(source: Path) -> Path:
    """Where `python -B` looks for a source file's bytecode: beside it (a child runs with -I,
    so no PYTHONPYCACHEPREFIX applies)."""
    return source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def missing(packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The directories of those installed packages whose `__init__.py` has no bytecode for this
    interpreter: installed without it. Nothing is imported to find them."""
    if not sys.implementation.cache_tag:
        return []  # an interpreter that never caches bytecode
    out = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec else None
        if not origin or not origin.endswith("__init__.py"):
            continue
        init = Path(origin)
        if not _pyc(init).exists():
            out.append(init.parent)
    return out


def compile_missing(
    packages: tuple[str, ...] = PACKAGES, *, allowed: bool | None = None, timeout_s: float = 900
) -> dict:
    """Compile the bytecode the packages lack, where this user may write it. Returns
    {"compiled": [dirs], "seconds": s, "still_missing": [dirs], "not_writable": [dirs]}
    ({} when nothing was missing)."""
    todo = missing(packages)
    if not todo:
        return {}
    if allowed is None:
        allowed = os.environ.get("AUTOWEB_COMPILE_BYTECODE", "1") != "0"
    writable = [d for d in todo if allowed and os.access(d, os.W_OK | os.X_OK)]
    out: dict = {"compiled": [], "seconds": 0.0, "still_missing": [], "not_writable": []}
    out["not_writable"] = [str(d) for d in todo if d not in writable]
    if writable:
        t0 = time.perf_counter()
        # Its own process: this one may hold threads, and compileall's workers fork. A file
        # that does not compile (a test written for another Python) only keeps its source.
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "-j", "0", *map(str, writable)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
        out["seconds"] = round(time.perf_counter() - t0, 1)
        left = {str(d) for d in missing(packages)}
        out["compiled"] = [str(d) for d in writable if str(d) not in left]
        out["still_missing"] = [str(d) for d in writable if str(d) in left]
    return out


def ensure() -> dict:
    """compile_missing() once per process, before its first sandboxed child starts; what it did
    goes to stderr. Later calls return {} at once."""
    global _checked
    with _lock:
        if _checked:
            return {}
        _checked = True
        try:
            done = compile_missing(PACKAGES)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"autoweb: compiling the packages' bytecode failed: {e}", file=sys.stderr)
            return {}
    if done.get("compiled"):
        print(
            f"autoweb: compiled the bytecode of {', '.join(done['compiled'])} in "
            f"{done['seconds']} s: installed without it, every sandboxed child compiled them "
            "again as it started",
            file=sys.stderr,
        )
    left = done.get("not_writable", []) + done.get("still_missing", [])
    if left:
        print(
            f"autoweb: {', '.join(left)} have no bytecode, so every sandboxed child compiles "
            f"them again as it starts; as their owner, run: {sys.executable} -m compileall "
            f"-q -j 0 {' '.join(left)}",
            file=sys.stderr,
        )
    return done
