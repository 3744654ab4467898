"""The sandboxed child's first steps, before the kernels package, torch or a candidate load.

Loaded by file path from the boot line (sandbox._BOOT), not as `kernels.harness.early`: the
package's __init__ imports torch, and torch starts threads, while Landlock confines only the
calling thread and what it creates afterwards. So this runs while the process has exactly one
thread, and it checks that it does.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def _limits() -> None:
    import resource

    def lim(name: str, what: int) -> None:
        raw = os.environ.get(name)
        if raw:
            v = int(raw)
            resource.setrlimit(what, (v, v))

    lim("AUTOWEB_LIMIT_AS", resource.RLIMIT_AS)
    lim("AUTOWEB_LIMIT_FSIZE", resource.RLIMIT_FSIZE)
    lim("AUTOWEB_LIMIT_NOFILE", resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def become_subreaper() -> bool:
    """Orphans of processes started below this one are re-parented to it, not to init, so they
    stay in its tree: a double fork with setsid cannot slip out of a sweep. Used by the sandboxed
    child on itself and by the worker (kernels.harness.sandbox.adopt_escaped_processes). False
    where it is not available (not Linux: the process-group kill still applies)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, *map(ctypes.c_ulong, (1, 0, 0, 0))) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _sibling(name: str):
    """kernels.harness.<name>, loaded by path and registered under its package name."""
    full = f"kernels.harness.{name}"
    if full in sys.modules:
        return sys.modules[full]
    spec = importlib.util.spec_from_file_location(full, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[full] = mod
    return mod


def _confine() -> dict:
    """Landlock below AUTOWEB_CONFINE_DIR, when the parent asked for it. Any failure is fatal: a
    candidate never runs believing it is confined when it is not. The no-socket filter comes
    later (kernels.harness.runner): the CUDA driver needs a socket while it initialises."""
    where = os.environ.get("AUTOWEB_CONFINE_DIR")
    if not where:
        return {}
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise RuntimeError(f"cannot confine: {threads} threads already running")
    lock = os.environ.get("AUTOWEB_GPU_LOCK")
    # The GPU lock's three files: the CUDA context is created under a shared hold, taken as
    # every other process of the host takes one (kernels.harness.gpulock).
    files = [str(p) for p in _sibling("gpulock").lock_files(lock)] if lock else []
    return _sibling("landlock").confine([where], files)


def prepare() -> dict:
    """Resource limits, subreaper, Landlock. Returns what was applied ({} when nothing)."""
    _limits()
    become_subreaper()
    return _confine()
