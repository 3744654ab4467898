"""The GPU worker: Django-free, serving the RQ queue `gpu.<kind>`; several may share one GPU.

    python -m kernels.worker [--redis URL] [--device auto|cuda|interpret] [--name NAME]

It detects its device (CUDA if present, else Triton's CPU interpreter, kind `interpret`),
measures the ceilings once (cached per device), registers itself in Redis and heartbeats, and
runs each evaluation job through the harness, returning the JSON report. Jobs run in this
process (`kernels.queues.QueueWorker`, an RQ SimpleWorker: no fork after CUDA is initialised);
every candidate still runs in its own sandboxed child. Progress (compiling, verifying shape
i/n, benchmarking) is appended to a Redis stream per search, which the web side forwards to
browsers.

A GPU host needs kernels, torch, triton and the `gpu` extra in pyproject.toml (rq, redis, psutil,
numpy, optuna).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import threading
from typing import Any

import redis

from kernels import problems
from kernels.harness import BaselineCache, evaluate, retime, time_together
from kernels.harness import device as devmod
from kernels.harness.gpulock import GpuSlots, gpu_key, slots_setting
from kernels.harness.sandbox import Pool, adopt_escaped_processes
from kernels.protocol import (
    HEARTBEAT_S,
    WORKERS_KEY,
    again_on_fault,
    queue_name,
    rejected_report,
    worker_key,
)
from kernels.queues import (
    QueueWorker,
    publish,
    register,
    rq_queue,
    serve,
)

_pool: Pool | None = None
_device: str | None = None
_name: str | None = None
_info: dict[str, Any] = {}
_baselines: BaselineCache | None = None  # on a GPU: shared by every job, on disk and in Redis
# On a GPU with AUTOWEB_GPU_SLOTS=n: at most n of this GPU's screening evaluations past compiling
# and not yet done with the GPU at once, across its workers (the others load and compile
# meanwhile).
_slots: GpuSlots | None = None


def evaluate_job(
    *,
    problem: str,
    source: str,
    tier: str = "smoke",
    search_id: int | None = None,
    trial_id: int | None = None,
    budget_s: float = 0.5,
    baselines_compiled: bool = True,
    timeout_s: float | None = None,
) -> dict:
    """RQ job: screen one candidate on this worker's device; returns the harness report. On a
    GPU the baselines come from the worker's cache (`kernels.harness.baselines`).

    Safe to run twice: it has no side effect but the report and progress events; recording
    the result is the orchestrator's job, and it is idempotent there.
    """
    from rq import get_current_job

    job = get_current_job()
    conn = (
        job.connection
        if job is not None
        else redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    )
    dev = _device or devmod.resolve("auto")

    def on_event(ev: dict) -> None:
        publish(conn, search_id, {"type": "trial_phase", "trial": trial_id, **ev, "worker": _name})

    try:
        prob = problems.load(problem)
    except problems.ProblemError as e:
        return _usage_report(problem, str(e), dev)
    # The heartbeat names the job being evaluated: the orchestrator retries a started job
    # only once no live worker names it (searches/orchestrator.py, DEAD_WORKER_S).
    _set_current_job(conn, job.id if job is not None else None)
    try:
        # The harness failing on its own part (HarnessFault) fails the job: the orchestrator
        # runs a failed evaluation again (MAX_ATTEMPTS), as it does a lost one.
        report = evaluate(
            prob,
            source,
            device=dev,
            tier=tier,
            on_event=on_event,
            pool=_pool,
            budget_s=budget_s,
            baselines_compiled=baselines_compiled,
            timeout_s=timeout_s,
            baselines=_baselines_for(conn) if baselines_compiled else None,
            gpu_slots=_slots,
        )
    except problems.ProblemError as e:  # the problem failed on its own (the harness checked)
        return _usage_report(problem, str(e), dev)
    finally:
        _set_current_job(conn, None)
    report["worker"] = _name
    return json.loads(json.dumps(report, default=str))  # plain JSON for RQ's serializer


def _baselines_for(conn: redis.Redis | None) -> BaselineCache | None:
    global _baselines
    if (_device or devmod.resolve("auto")) != "cuda":
        return None
    if _baselines is None:
        _baselines = BaselineCache(redis=conn)
    return _baselines


def _timed_together(timer, problem: str, sources: list[str], **kw) -> list[dict] | dict:
    """A re-time or a table job's body: `timer` (`retime` or `time_together`) on this GPU,
    with this worker's baseline cache, so each shape is timed in its baselines' mode as the
    screening was and prepared while the GPU is shared. {"error": ...} for an unknown problem
    or one that fails on its own."""
    from rq import get_current_job

    with _job():
        try:
            prob = problems.load(problem)
        except problems.ProblemError as e:
            return {"error": str(e)}
        job = get_current_job()
        try:
            out = timer(
                prob,
                sources,
                device=_device or devmod.resolve("auto"),
                pool=_pool,
                baselines=_baselines_for(job.connection if job is not None else None),
                **kw,
            )
        except problems.ProblemError as e:  # the problem failed on its own (the harness checked)
            return {"error": str(e)}
    return json.loads(json.dumps(out, default=str))


def confirm_job(
    *,
    problem: str,
    sources: list[str],
    tier: str = "full",
    search_id: int | None = None,
    trial_id: int | None = None,
    budget_s: float = 0.5,
    timeout_s: float | None = None,
) -> list[dict] | dict:
    """RQ job: re-time [incumbent, challenger] interleaved in one sandbox on this GPU (the
    confirmation a screening win needs before it is kept). Returns their numbers, or
    {"error": ...} when the problem is unknown."""
    return _timed_together(
        retime, problem, sources, tier=tier, timeout_s=timeout_s, budget_s=budget_s
    )


def table_job(
    *,
    problem: str,
    sources: list[str],
    tier: str = "full",
    search_id: int | None = None,
    budget_s: float = 0.5,
    timeout_s: float | None = None,
) -> dict:
    """RQ job: time a search's chosen candidates and both baselines interleaved on every shape,
    in one sandbox on this GPU: what the per-shape dispatch table is built from. The harness
    failing on its own part is tried again here (`again_on_fault`): the orchestrator runs a
    failed evaluation, confirmation or re-validation job again, but not a table's."""
    return again_on_fault(
        lambda: _timed_together(
            time_together, problem, sources, tier=tier, timeout_s=timeout_s, budget_s=budget_s
        )
    )


@contextlib.contextmanager
def _job():
    """Around a job: the heartbeat names it, so the job of a worker that died is retried."""
    from rq import get_current_job

    job = get_current_job()
    if job is not None:
        _set_current_job(job.connection, job.id)
    try:
        yield
    finally:
        if job is not None:
            _set_current_job(job.connection, None)


def revalidate_job(
    *,
    problem: str,
    source: str,
    shape_range: dict | None = None,
    revalidation_id: int | None = None,
    budget_s: float = 0.5,
    timeout_s: float | None = None,
) -> dict:
    """RQ job: re-validate an approved kernel before release (kernels.revalidate); returns the
    report with `revalidation` = {passed, reasons}. Side-effect free like evaluate_job."""
    from kernels.revalidate import revalidate

    dev = _device or devmod.resolve("auto")
    try:
        prob = problems.load(problem)
    except problems.ProblemError as e:
        return _usage_report(problem, str(e), dev)
    with _job():
        try:
            report = revalidate(
                prob,
                source,
                device=dev,
                shape_range=shape_range,
                pool=_pool,
                budget_s=budget_s,
                timeout_s=timeout_s,
            )
        except problems.ProblemError as e:
            report = _usage_report(problem, str(e), dev)
    report["worker"] = _name
    report["revalidation_id"] = revalidation_id
    return json.loads(json.dumps(report, default=str))


def _set_current_job(conn: redis.Redis, job_id: str | None) -> None:
    if job_id is None:
        _info.pop("job", None)
    else:
        _info["job"] = job_id
    if _name is not None:
        with contextlib.suppress(redis.RedisError):  # the next heartbeat carries it anyway
            register(conn, _name, _info)


def _usage_report(problem: str, why: str, dev: str) -> dict:
    return rejected_report(
        "malformed",
        [f"malformed: {why}"],
        problem=problem,
        device=devmod.info(dev, measure_ceilings=False),
        worker=_name,
    )


def _heartbeat_loop(url: str, name: str, info: dict, stop: threading.Event) -> None:
    conn = redis.Redis.from_url(url)
    while not stop.wait(HEARTBEAT_S):
        with contextlib.suppress(redis.RedisError):  # Redis restarting: next beat re-registers
            register(conn, name, info)


def main(argv: list[str] | None = None) -> int:
    global _pool, _device, _name, _slots
    ap = argparse.ArgumentParser(prog="python -m kernels.worker", description=__doc__)
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "interpret"])
    ap.add_argument("--name", default=None, help="default: host:gpu<index> or host:interpret")
    ap.add_argument("--warm", type=int, default=2, help="sandboxes kept started ahead")
    ap.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    args = ap.parse_args(argv)
    try:
        _device = devmod.resolve(args.device)
        # Unset: every worker of the GPU may be on it at once.
        slots = slots_setting("AUTOWEB_GPU_SLOTS", os.environ.get("AUTOWEB_GPU_SLOTS"), None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if _device == "cuda" and slots:
        try:
            _slots = GpuSlots(gpu_key(), slots)
        except OSError as e:
            print(f"error: AUTOWEB_GPU_SLOTS: cannot use the slot files: {e}", file=sys.stderr)
            return 2
    info = _info
    info.update(devmod.info(_device))
    kind = info["kind"]
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0") if _device == "cuda" else "cpu"
    _name = args.name or f"{platform.node()}:{'gpu' + gpu if _device == 'cuda' else 'interpret'}"
    info["queue"] = queue_name(kind)
    conn = redis.Redis.from_url(args.redis)
    register(conn, _name, info)
    stop = threading.Event()
    threading.Thread(
        target=_heartbeat_loop, args=(args.redis, _name, info, stop), daemon=True
    ).start()
    # Processes a candidate leaves behind after killing its own sandbox process come here and
    # are killed when that sandbox is closed (kernels.harness.sandbox.sweep_escaped).
    adopt_escaped_processes()
    _pool = Pool(_device, size=args.warm)
    print(f"worker {_name}: {info['name']} ({kind}) on queue {queue_name(kind)}", flush=True)

    def make_worker(attempt: int) -> QueueWorker:
        return QueueWorker(
            [rq_queue(queue_name(kind), conn)],
            connection=conn,
            name=f"{_name}:{os.getpid()}:{attempt}".replace(":", "-"),
        )

    def shutdown(*_):
        stop.set()
        if _pool is not None:
            _pool.close()

    signal.signal(signal.SIGTERM, lambda *a: (shutdown(), sys.exit(0)))
    try:
        serve(
            make_worker,
            conn,
            burst=args.burst,
            name=f"worker {_name}",
            on_reconnect=lambda: register(conn, _name, info),
        )
    finally:
        shutdown()
        with contextlib.suppress(redis.RedisError):
            conn.delete(worker_key(_name))
            conn.srem(WORKERS_KEY, _name)
    return 0


if __name__ == "__main__":
    # RQ imports jobs as `kernels.worker`; run main() there so the job functions see the
    # device, pool and name it sets up (not this `__main__` copy of the module).
    from kernels import worker as _module

    raise SystemExit(_module.main())
