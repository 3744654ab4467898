"""Jobs and results travel through Redis as JSON, never pickle: a job planted by anyone who can
write to Redis (a compromised GPU host, say) is data, not code, for the process that reads it.

The planted job's payload is a pickle that would create a marker file when unpickled; the real
orchestrator and GPU worker processes take it from their queues and must not create it."""

from __future__ import annotations

import json
import os
import time
import zlib

import pytest
from rq import Queue
from rq.job import Callback, Job
from rq.serializers import JSONSerializer

from kernels.protocol import queue_name
from kernels.queues import fetch_job, rq_queue

pytestmark = pytest.mark.django_db(transaction=True)


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(conn, queue: str, func: str, marker: str) -> str:
    """A job in RQ's default (pickle) format on `queue`, as an attacker would write it."""
    pickled = Queue(queue, connection=conn)  # the default serializer: pickle
    job_id = "evil-" + queue.replace(".", "-")
    job = Job.create(func, args=(_Evil(marker),), connection=conn, id=job_id)
    pickled.enqueue_job(job)
    return job.id


def _run_to_exit(stack: dict, proc, timeout: float = 120) -> str:
    """Wait for a burst to end; returns what the stack's processes logged."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the process did not finish its burst"
        time.sleep(0.2)
    return stack["procs"].log_tails(20000)


@pytest.mark.parametrize("who", ["orchestrator", "gpu worker"], ids=["orchestrator", "gpu-worker"])
def test_a_pickled_job_planted_in_redis_is_never_unpickled(env, tmp_path, who):
    marker = tmp_path / "pwned"
    if who == "orchestrator":
        _plant(env["redis"], "search", "searches.tasks.run_search", str(marker))
        proc = env["start"]("manage.py", "orchestrator", "--burst")
    else:
        _plant(env["redis"], queue_name("interpret"), "kernels.worker.evaluate_job", str(marker))
        proc = env["start"](
            "-m", "kernels.worker", "--device", "interpret", "--name", "t:json", "--burst"
        )
    out = _run_to_exit(env, proc)
    assert not marker.exists(), f"the planted pickle ran code in the {who}:\n{out[-2000:]}"


@pytest.mark.parametrize("who", ["orchestrator", "gpu worker"], ids=["orchestrator", "gpu-worker"])
def test_a_json_job_naming_any_other_function_or_a_callback_is_refused(env, tmp_path, who):
    """JSON alone does not make a job data: RQ imports whatever function a job names. Only
    autoweb's own job functions run, and callbacks never do; the process keeps serving."""
    marker = tmp_path / "pwned"
    queue = "search" if who == "orchestrator" else queue_name("interpret")
    plain = Queue(queue, connection=env["redis"], serializer=JSONSerializer)
    plain.enqueue("os.system", f"touch {marker}", job_id="evil-func")
    allowed = (
        "searches.tasks.run_search" if who == "orchestrator" else "kernels.worker.evaluate_job"
    )
    args = (10**9,) if who == "orchestrator" else ()
    kwargs = {} if who == "orchestrator" else {"problem": "softmax", "source": "def kernel(x): ..."}
    plain.enqueue(
        allowed,
        *args,
        **kwargs,
        job_id="evil-callback",
        on_success=Callback("os.system"),
        on_failure=Callback("os.system"),
    )
    if who == "orchestrator":
        proc = env["start"]("manage.py", "orchestrator", "--burst")
    else:
        proc = env["start"](
            "-m", "kernels.worker", "--device", "interpret", "--name", "t:json", "--burst"
        )
    out = _run_to_exit(env, proc)
    assert not marker.exists(), out[-2000:]
    assert proc.returncode == 0, out[-2000:]
    job = fetch_job("evil-func", env["redis"])
    assert job.get_status() == "failed"
    assert "is not an autoweb job" in job.latest_result().exc_string
    job = fetch_job("evil-callback", env["redis"])
    assert job.get_status() == "failed", job.get_status()
    assert "callbacks are not run" in job.latest_result().exc_string


def test_queues_write_json_and_read_it_back(env):
    q = rq_queue("gpu.interpret", env["redis"])
    job = q.enqueue("kernels.worker.evaluate_job", kwargs={"problem": "softmax", "source": "x"})
    raw = zlib.decompress(env["redis"].hget(f"rq:job:{job.id}", "data"))  # RQ compresses
    assert json.loads(raw)[3] == {"problem": "softmax", "source": "x"}  # (func, obj, args, kwargs)
    back = fetch_job(job.id, env["redis"])
    assert back.kwargs == {"problem": "softmax", "source": "x"}
