"""The workers page and the dashboard's worker panel, with Redis up and with Redis down."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from kernels.queues import register, rq_queue
from searches import services

pytestmark = pytest.mark.django_db

H200_INFO = {
    "kind": "h200",
    "name": "NVIDIA H200",
    "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0"},
    "ceilings": {"copy_gbps": 4176.9, "matmul_tflops_bf16": 793.7, "device": "NVIDIA H200"},
    "queue": "gpu.h200",
}


def _queue_two_jobs(conn) -> None:
    queue = rq_queue("gpu.h200", conn)
    for i in range(2):  # never run: only counted
        queue.enqueue("kernels.worker.evaluate_job", problem="softmax", source=f"# {i}")


def test_a_worker_heartbeating_in_redis_is_shown_online_with_its_queue(engineer_client, redis_url):
    register(redis_url, "gpuhost:gpu0", H200_INFO)
    _queue_two_jobs(redis_url)
    html = engineer_client.get(reverse("searches:workers")).content.decode()
    card = html[html.index("gpuhost:gpu0") :]
    assert 'badge-online">online' in card
    assert '<span class="chip">h200</span>' in card
    assert "NVIDIA H200" in card
    assert "copy 4177 GB/s" in card and "bf16 matmul 793.7 TFLOP/s" in card
    assert "triton 3.6.0" in card
    assert "2 waiting" in card
    assert " s ago" in card
    assert "gpu.h200: 2 waiting" in html
    assert 'id="redis-error"' not in html


def test_the_dashboard_shows_online_workers_and_queue_depth(client, outsider, redis_url):
    register(redis_url, "gpuhost:gpu0", H200_INFO)
    _queue_two_jobs(redis_url)
    client.force_login(outsider)
    html = client.get(reverse("searches:dashboard")).content.decode()
    fleet = html[html.index('id="fleet"') :]
    assert "<code>gpuhost:gpu0</code>" in fleet
    assert '<td class="num">2</td>' in fleet
    assert "NVIDIA H200" in fleet


def test_an_expired_heartbeat_is_not_online(engineer_client, redis_url):
    register(redis_url, "gone:gpu0", H200_INFO)
    redis_url.delete("autoweb:worker:gone:gpu0")  # the heartbeat key expired
    html = engineer_client.get(reverse("searches:dashboard")).content.decode()
    assert "gone:gpu0" not in html
    assert "No GPU worker is online" in html


def test_registered_workers_are_listed_online_or_not(engineer_client, redis_url):
    services.upsert_worker(
        name="old:gpu1",
        kind="a100",
        device_name="NVIDIA A100-SXM4-80GB",
        ceilings={"copy_gbps": 1700.0},
        versions={"torch": "2.4.0"},
        queue="gpu.a100",
        now=timezone.now() - timedelta(hours=3),
    )
    html = engineer_client.get(reverse("searches:workers")).content.decode()
    card = html[html.index("old:gpu1") :]
    assert 'badge-offline">offline' in card
    assert "NVIDIA A100-SXM4-80GB" in card
    assert "3 h ago" in card
    assert "gpu.a100: 0 waiting" in html


def test_with_redis_unreachable_the_pages_say_so_instead_of_failing(
    engineer_client, dead_redis, idea
):
    started = time.monotonic()
    for name in ("workers", "dashboard", "idea_new"):
        response = engineer_client.get(reverse(f"searches:{name}"))
        assert response.status_code == 200, name
        if name != "idea_new":
            html = response.content.decode()
            assert "is unreachable" in html, name
            assert dead_redis.split("//")[1] in html, name
    assert time.monotonic() - started < 10
