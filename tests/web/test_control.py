"""The control plane (`core.control`): leases, slices, control jobs and the start-up recovery
that each app registers. Real Redis."""

from __future__ import annotations

import time

from core import control
from kernels.protocol import RUN_SEARCH_JOB, SEARCH_QUEUE, WATCH_REVIEW_JOB
from kernels.queues import fetch_job
from library import watch
from searches import orchestrator


def test_one_holder_at_a_time_and_only_the_holder_renews_or_releases(redis_url):
    first = control.Lease(redis_url, "autoweb:test-lease", 10)
    second = control.Lease(redis_url, "autoweb:test-lease", 10)
    assert first.acquire()
    assert not second.acquire()
    assert not second.renew()
    second.release()  # not its lease: nothing happens
    assert redis_url.get("autoweb:test-lease") == first.token.encode()
    redis_url.expire("autoweb:test-lease", 2)
    assert first.renew() and redis_url.ttl("autoweb:test-lease") > 2
    first.release()
    assert redis_url.get("autoweb:test-lease") is None
    assert second.acquire()


def test_a_dead_holders_lease_is_waited_out(redis_url):
    dead = control.Lease(redis_url, "autoweb:test-lease", 1)
    assert dead.acquire()  # and never renewed
    taker = control.Lease(redis_url, "autoweb:test-lease", 10)
    started = time.monotonic()
    assert taker.acquire(wait_s=5, poll_s=0.05)
    assert time.monotonic() - started < 4
    assert not dead.renew()


def test_a_fractional_ttl_is_rounded_up_to_whole_seconds(redis_url):
    lease = control.Lease(redis_url, "autoweb:test-lease", 5.2)
    assert lease.acquire()
    assert redis_url.ttl("autoweb:test-lease") == 6


def test_a_control_job_is_json_on_the_search_queue_without_a_timeout(redis_url):
    job = control.enqueue(redis_url, WATCH_REVIEW_JOB, 42, job_id="autoweb-test-job")
    assert control.search_queue(redis_url).name == SEARCH_QUEUE
    assert control.search_queue(redis_url).job_ids == ["autoweb-test-job"]
    stored = fetch_job(job.id, redis_url)
    assert (stored.func_name, tuple(stored.args)) == (WATCH_REVIEW_JOB, (42,))
    assert stored.timeout == -1
    assert (stored.result_ttl, stored.failure_ttl) == (control.RESULT_TTL_S, control.FAILURE_TTL_S)


def test_a_slice_ends_when_its_time_is_up_or_another_job_waits(redis_url):
    assert not control.slice_over(redis_url, 1.0, 5.0)
    assert control.slice_over(redis_url, 5.5, 5.0)
    control.enqueue(redis_url, RUN_SEARCH_JOB, 1)
    assert control.slice_over(redis_url, 1.0, 5.0)


def test_a_slice_goes_on_while_redis_is_down(dead_redis):
    conn = control.redis_conn()
    assert not control.slice_over(conn, 1.0, 5.0)


def test_passes_over_a_thing_are_paced_by_the_poll_interval(redis_url):
    started = time.monotonic()
    control.pace(redis_url, "test-thing", 5.0)  # never passed over: no wait
    assert time.monotonic() - started < 1.0
    control.passed(redis_url, "test-thing", 0.4)
    control.pace(redis_url, "test-thing", 0.4)
    assert time.monotonic() - started >= 0.4
    redis_url.set(control.pass_key("test-thing"), "not a time")
    started = time.monotonic()
    control.pace(redis_url, "test-thing", 5.0)  # unreadable: no wait rather than a crash
    assert time.monotonic() - started < 1.0


def test_pacing_goes_on_while_redis_is_down(dead_redis):
    conn = control.redis_conn()
    control.passed(conn, "test-thing", 5.0)
    started = time.monotonic()
    control.pace(conn, "test-thing", 5.0)
    assert time.monotonic() - started < 4.0


def test_every_app_registers_what_an_orchestrator_resumes(monkeypatch):
    # Registered in SearchesConfig.ready() and LibraryConfig.ready(), in INSTALLED_APPS order.
    assert list(control._recoveries) == ["active search(es)", "re-validating approval(s)"]
    assert control._recoveries["active search(es)"] is orchestrator.recover
    assert control._recoveries["re-validating approval(s)"] is watch.recover
    monkeypatch.setattr(control, "_recoveries", {"a": lambda: 2, "b": lambda: 0})
    assert control.recover() == {"a": 2, "b": 0}
