"""Cached baseline timings: eager and torch.compile of a problem's reference, per shape.

Screening a candidate needs the baselines' times on every shape, but they do not change from
one candidate to the next: timing them (and compiling torch.compile for every shape) in every
candidate's sandbox was most of an evaluation's cost. They are measured once per

    (GPU kind and name, problem and its module's source, dtype, shape, torch/triton/CUDA/driver)

in a sandboxed child that loads no candidate (so no candidate can slow them down to look
fast), and kept in memory, on disk (one JSON file per key, in the cache directory) and, when a
Redis connection is given, in Redis for the other workers of that kind.

Every screened candidate still times a drift canary: the eager baseline on one shape,
interleaved with the candidate. When it moved beyond noise (`drifted`), the cached numbers are
dropped and measured again before the report is written. A cache file whose key fields do not
match (another torch version, say) is ignored and measured again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernels import problems
from kernels.protocol import baselines_key

# A canary within this fraction of its cached time never counts as drift, however tight both
# measurements are: clocks and co-tenants move a GPU by a percent or two from minute to minute.
DRIFT_FLOOR = 0.03
REDIS_TTL_S = 30 * 86400
FORMAT = 1

Entry = dict[str, Any]  # one shape: {"eager": stats, "compiled": stats|None, "mode", ...}


def key_fields(problem: problems.Problem, device_info: dict, dtype: str) -> dict[str, Any]:
    """What the cached numbers depend on; any change means measuring again."""
    versions = device_info.get("versions") or {}
    try:
        source = problem.path.read_bytes()
    except OSError:
        source = b""
    return {
        "format": FORMAT,
        "problem": problem.name,
        "problem_sha256": hashlib.sha256(source).hexdigest(),
        "dtype": dtype,
        "kind": device_info.get("kind"),
        "device_name": device_info.get("name"),
        "torch": versions.get("torch"),
        "triton": versions.get("triton"),
        "cuda": versions.get("cuda"),
        "driver": versions.get("driver"),
    }


def digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def drifted(cached: dict | None, now: dict | None) -> tuple[bool, float | None]:
    """Whether the canary's median moved from the cached one beyond both spreads (and the
    floor). Returns (drifted, now / cached). Missing numbers count as drift: nothing to trust."""
    c_ms, n_ms = _num((cached or {}).get("median")), _num((now or {}).get("median"))
    if c_ms is None or n_ms is None or c_ms <= 0:
        return True, None
    ratio = n_ms / c_ms
    noise = (_num(cached.get("spread")) or 0.0) + (_num(now.get("spread")) or 0.0)
    return abs(ratio - 1.0) > max(DRIFT_FLOOR, noise), ratio


def settle_canary(
    cache: BaselineCache,
    fields: dict[str, Any],
    labels: list[str],
    entries: list[Entry],
    canary: int,
    now: dict | None,
    remeasure: Callable[[], list[Entry]],
) -> tuple[list[Entry], dict[str, Any]]:
    """Check a screened candidate's canary against the cached eager time of that shape. When
    it drifted, the key is dropped, measured again (`remeasure`, in a clean sandbox) and stored;
    returns the entries to place the candidate against and what the report says about them."""
    moved, ratio = drifted(entries[canary]["eager"], now)
    info: dict[str, Any] = {
        "measured_at": min(str(e.get("measured_at", "")) for e in entries) or None,
        "canary": {
            "shape": labels[canary],
            "cached_ms": entries[canary]["eager"].get("median"),
            "now_ms": (now or {}).get("median"),
            "ratio": ratio,
            "drift": bool(moved and now is not None),
        },
        "key": digest(fields),
    }
    if now is None or not moved:
        return entries, info
    with cache.lock(fields):
        cache.drop(fields)
        fresh = remeasure()
        cache.put(fields, labels, fresh)
    info.update(
        source="re-measured after drift",
        measured_at=min(str(e.get("measured_at") or "") for e in cache.get(fields, labels) or fresh)
        or None,
    )
    return cache.get(fields, labels) or fresh, info


def bars(entries: list[Entry]) -> dict[str, float]:
    """{shape index: the faster baseline's cached median, ms}: the time a screened candidate
    must beat to serve the shape. Sampling a candidate stops once it has lost to it beyond doubt
    (`timing.lost`)."""
    out = {}
    for i, e in enumerate(entries):
        times = [_num((e.get(k) or {}).get("median")) for k in ("eager", "compiled")]
        times = [t for t in times if t is not None and t > 0]
        if times:
            out[str(i)] = min(times)
    return out


def canary_index(entries: list[Entry]) -> int:
    """The shape whose eager time is the median of the sweep's: long enough to time stably,
    short enough to cost little."""
    order = sorted(range(len(entries)), key=lambda i: _num(entries[i]["eager"]["median"]) or 0.0)
    return order[len(order) // 2]


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("eager"), dict):
        return False
    if _num(entry["eager"].get("median")) is None or entry.get("mode") not in ("graph", "events"):
        return False
    compiled = entry.get("compiled")
    return compiled is None or (
        isinstance(compiled, dict) and _num(compiled.get("median")) is not None
    )


class BaselineCache:
    """Baseline timings by key, shared by every sandbox and search this process runs.

    `redis` is a redis-py connection (the GPU worker's); without one only memory and disk are
    used. Thread-safe; `lock(fields)` also excludes other processes on this host while one of
    them measures a missing key, so a key is measured once.
    """

    def __init__(self, directory: str | Path | None = None, redis: Any = None) -> None:
        if directory is None:
            from kernels.harness.device import cache_dir

            directory = cache_dir() / "baselines"
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.redis = redis
        self._memory: dict[str, dict[str, Any]] = {}
        self._mutex = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self.ignored: list[str] = []  # why cached data was passed over, for the report

    # -- storage ----------------------------------------------------------------------------

    def _path(self, fields: dict[str, Any]) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in str(fields["problem"]))
        kind = "".join(c if c.isalnum() or c in "-_" else "-" for c in str(fields["kind"]))
        return self.dir / f"{safe}-{kind}-{digest(fields)}.json"

    def _load(self, fields: dict[str, Any]) -> dict[str, Any]:
        key = digest(fields)
        with self._mutex:
            if key in self._memory:
                return self._memory[key]
        data = self._read_disk(fields) or self._read_redis(fields) or {}
        with self._mutex:
            self._memory.setdefault(key, {"fields": fields, "shapes": {}})
            self._memory[key]["shapes"].update(data.get("shapes", {}))
            return self._memory[key]

    def _checked(self, raw: Any, fields: dict[str, Any], where: str) -> dict[str, Any] | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("shapes"), dict):
            self.ignored.append(f"{where}: not a baseline cache file; ignored")
            return None
        if raw.get("fields") != fields:
            theirs = raw.get("fields") if isinstance(raw.get("fields"), dict) else {}
            diff = sorted(k for k in fields if theirs.get(k) != fields[k])
            self.ignored.append(
                f"{where}: measured under other {', '.join(diff) or 'fields'}; ignored"
            )
            return None
        shapes = {k: v for k, v in raw["shapes"].items() if _valid_entry(v)}
        return {"fields": fields, "shapes": shapes}

    def _read_disk(self, fields: dict[str, Any]) -> dict[str, Any] | None:
        path = self._path(fields)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self.ignored.append(f"{path.name}: unreadable; ignored")
            return None
        return self._checked(raw, fields, path.name)

    def _read_redis(self, fields: dict[str, Any]) -> dict[str, Any] | None:
        if self.redis is None:
            return None
        try:
            raw = self.redis.get(baselines_key(digest(fields)))
        except Exception:  # Redis away: measuring again is always correct, only slower
            return None
        if raw is None:
            return None
        try:
            return self._checked(json.loads(raw), fields, "redis")
        except ValueError:
            return None

    def _write(self, fields: dict[str, Any], data: dict[str, Any]) -> None:
        path = self._path(fields)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, path)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.set(
                    baselines_key(digest(fields)),
                    json.dumps(data, default=str),
                    ex=REDIS_TTL_S,
                )

    # -- the API ----------------------------------------------------------------------------

    def get(self, fields: dict[str, Any], labels: list[str]) -> list[Entry] | None:
        """The cached entries for every label, or None when any is missing."""
        shapes = self._load(fields)["shapes"]
        out = [shapes.get(label) for label in labels]
        return None if any(e is None for e in out) else [dict(e) for e in out]

    def put(self, fields: dict[str, Any], labels: list[str], entries: list[Entry]) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._mutex:
            data = self._memory.setdefault(digest(fields), {"fields": fields, "shapes": {}})
            for label, entry in zip(labels, entries, strict=True):
                data["shapes"][label] = {**entry, "measured_at": entry.get("measured_at") or stamp}
            snapshot = json.loads(json.dumps(data, default=str))
        self._write(fields, snapshot)

    def drop(self, fields: dict[str, Any]) -> None:
        """Forget every shape of this key (the canary drifted): the next use measures again."""
        with self._mutex:
            self._memory[digest(fields)] = {"fields": fields, "shapes": {}}
        with contextlib.suppress(OSError):
            self._path(fields).unlink()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.delete(baselines_key(digest(fields)))

    @contextlib.contextmanager
    def lock(self, fields: dict[str, Any]):
        """Held while a key is measured: by one thread here and one process on this host."""
        key = digest(fields)
        with self._mutex:
            thread_lock = self._key_locks.setdefault(key, threading.Lock())
        with thread_lock, open(self._path(fields).with_suffix(".lock"), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                # Another process may have measured it while this one waited.
                with self._mutex:
                    self._memory.pop(key, None)
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
