"""Tests of the benchmark scripts, each run as a user runs it: a subprocess from the repo root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python benchmarks/<script> ARGS...` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
