"""The device a harness runs on: kind, name, versions, measured ceilings (cached)."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import torch
import triton

KINDS = {"H200": "h200", "H100": "h100", "B200": "b200", "A100": "a100", "L40S": "l40s"}


def resolve(device: str) -> str:
    if device not in ("auto", "cuda", "interpret"):
        raise ValueError(f"unknown device {device!r}: use auto, cuda or interpret")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "interpret"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but no CUDA device is visible")
    return device


def kind_of(name: str) -> str:
    for key, kind in KINDS.items():
        if key in name.upper():
            return kind
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


@functools.cache
def versions() -> dict:
    """Python, torch, triton, CUDA and driver versions (nvidia-smi once per process: it takes
    up to seconds, and every evaluation's report carries these)."""
    v = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            v["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    return v


def cache_dir() -> Path:
    d = Path(os.environ.get("AUTOWEB_CACHE_DIR", Path.home() / ".cache" / "autoweb"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _ceilings_path() -> Path:
    props = torch.cuda.get_device_properties(0)
    ident = str(getattr(props, "uuid", "")) or props.name
    safe = re.sub(r"[^A-Za-z0-9]+", "-", f"{props.name}-{ident}-{torch.__version__}")
    return cache_dir() / f"ceilings-{safe}.json"


def ceilings(measure: bool = False) -> dict | None:
    """Measured ceilings for the visible CUDA device, from cache unless `measure`."""
    if not torch.cuda.is_available():
        return None
    path = _ceilings_path()
    if path.exists() and not measure:
        with contextlib.suppress(ValueError, OSError):
            return json.loads(path.read_text())
    from kernels.harness.timing import measure_ceilings

    c = measure_ceilings("cuda")
    c["device"] = torch.cuda.get_device_name(0)
    path.write_text(json.dumps(c, indent=2))
    torch.cuda.empty_cache()
    return c


def info(device: str, measure_ceilings: bool = True) -> dict:
    """The device's description for reports (a fresh copy; computed once per process)."""
    return copy.deepcopy(_info(device, measure_ceilings))


@functools.cache
def _info(device: str, measure_ceilings: bool) -> dict:
    if device == "interpret":
        return {
            "kind": "interpret",
            "name": "Triton CPU interpreter",
            "versions": dict(versions()),
            "ceilings": None,
            "timings": "not meaningful: correctness and checks only",
            "host": platform.node(),
        }
    name = torch.cuda.get_device_name(0)
    props = torch.cuda.get_device_properties(0)
    return {
        "kind": kind_of(name),
        "name": name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gb": round(props.total_memory / 1e9, 1),
        "versions": dict(versions()),
        "ceilings": ceilings() if measure_ceilings else None,
        "host": platform.node(),
        "executable": sys.executable,
    }
