"""Faults with real processes: Redis restarted (empty, as a server without persistence comes
back) while a search runs. The database is the record; queues, leases and heartbeats are
rebuilt, and the search finishes with every trial judged once."""

from __future__ import annotations

import time

import pytest

from searches.models import Search
from tests.web.processes import Processes, RedisServer
from tests.web.test_search_e2e import _search, _wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def stack(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    procs = Processes(server.url, tmp_path)
    yield {"redis": server, "start": procs.start, "procs": procs}
    procs.stop_all()
    if server.proc.poll() is None:
        server.kill()


def test_a_redis_restart_mid_search_loses_no_trial_and_repeats_none(stack, settings):
    search = _search(settings, stack["redis"].url, max_trials=4)
    worker = stack["start"]("-m", "kernels.worker", "--device", "interpret", "--name", "f:w")
    orch = stack["start"]("manage.py", "orchestrator")
    _wait(search, lambda s: s.trials.filter(status__in=["kept", "reverted", "failed"]).exists())
    stack["redis"].kill()
    time.sleep(3)  # clients see refused connections for a while
    stack["redis"].start()
    try:
        search = _wait(search, lambda s: s.status == Search.Status.FINISHED, timeout=360)
    except AssertionError:
        raise AssertionError(stack["procs"].log_tails()) from None
    assert worker.poll() is None, "the worker survived the restart"
    assert orch.poll() is None, "the orchestrator survived the restart"
    trials = list(search.trials.order_by("index"))
    assert [t.index for t in trials] == [1, 2, 3, 4]
    assert all(t.terminal for t in trials)
    assert len({t.source_sha256 for t in trials}) == 4, "no candidate evaluated twice"
    assert search.trials_total == 4
    assert search.stop_reason.startswith("budget: trials")


def test_a_search_that_stops_improving_finishes_on_its_plateau(stack, settings):
    """On the interpreter no timing beats the first incumbent, so with patience 2 the search
    ends after three trials, well inside its trial budget, and says why."""
    from django.contrib.auth import get_user_model

    from searches import services
    from tests.web.domain import queue_search

    settings.REDIS_URL = stack["redis"].url
    user = get_user_model().objects.create_user("plateau", password="pw")
    services.grant_role(user=user, role="engineers")
    search = queue_search(
        user,
        start={"plateau_patience": 2},
        title="softmax plateau",
        target_kinds=["interpret"],
        prohibitions="",
        max_trials=12,
        max_wall_minutes=30,
    )
    stack["start"]("-m", "kernels.worker", "--device", "interpret", "--name", "f:p")
    stack["start"]("manage.py", "orchestrator")
    search = _wait(search, lambda s: s.status == Search.Status.FINISHED, timeout=300)
    assert search.stop_reason == "plateau (2 trials in a row without a new incumbent)"
    assert search.trials_total == 3
    assert all(t.terminal for t in search.trials.all())


def test_the_worker_and_the_orchestrator_stop_on_sigterm_while_redis_is_down(stack):
    """Redis gone and the processes told to stop, as `manage.py up` does when its Redis dies or
    a deploy stops the services during an outage: each ends at once with exit code 0. (The
    worker used to take the stop for Redis going away and wait for it to come back.)"""
    import signal
    import subprocess

    worker = stack["start"]("-m", "kernels.worker", "--device", "interpret", "--name", "f:s")
    orch = stack["start"]("manage.py", "orchestrator")
    procs = stack["procs"]
    deadline = time.monotonic() + 120
    while procs.log_tails().count("Listening on") < 2:
        assert time.monotonic() < deadline, procs.log_tails()
        assert worker.poll() is None and orch.poll() is None, procs.log_tails()
        time.sleep(0.2)
    stack["redis"].kill()
    time.sleep(2)  # each has found Redis gone: RQ waits and asks again
    for p in (worker, orch):
        p.send_signal(signal.SIGTERM)
    codes = []
    for p in (worker, orch):
        try:
            codes.append(p.wait(timeout=20))
        except subprocess.TimeoutExpired:
            codes.append("still running")
    assert codes == [0, 0], procs.log_tails()
    assert "Traceback" not in procs.log_tails(), procs.log_tails()


def test_a_worker_idle_through_a_redis_outage_takes_work_soon_after_it_ends(stack):
    """RQ doubles its wait between tries to reach Redis (tries about 3, 7, 15 and 31 s into an
    outage): after a 16 s outage an idle worker slept on for 15 s more. Its wait is capped at
    5 s."""
    import redis as redis_lib

    from kernels.protocol import TABLE_JOB, queue_name
    from kernels.queues import rq_queue

    worker = stack["start"]("-m", "kernels.worker", "--device", "interpret", "--name", "f:o")
    procs = stack["procs"]
    deadline = time.monotonic() + 120
    while "Listening on" not in procs.log_tails():
        assert time.monotonic() < deadline and worker.poll() is None, procs.log_tails()
        time.sleep(0.2)
    stack["redis"].kill()
    time.sleep(16)
    stack["redis"].start()
    conn = redis_lib.Redis.from_url(stack["redis"].url)
    back = time.monotonic()
    job = rq_queue(queue_name("interpret"), conn).enqueue(
        TABLE_JOB, kwargs={"problem": "no-such-problem", "sources": []}
    )
    while job.get_status(refresh=True) in ("queued", None):
        assert time.monotonic() - back < 10, "the worker took no job 10 s after Redis was back"
        time.sleep(0.1)
    assert worker.poll() is None, procs.log_tails()
