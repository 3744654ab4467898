"""The workers page and the dashboard's worker panel, with Redis up and with Redis down."""

from __future__ import annotations

import re
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


def test_a_trial_waiting_for_a_kind_with_no_worker_online_says_so(
    engineer_client, search, redis_url
):
    from tests.web.domain import propose

    trial = propose(search, 1)
    kind = search.idea.target_kinds[0]
    url = reverse("searches:trial", args=[search.pk, trial.index])
    html = engineer_client.get(url).content.decode()
    assert f"waiting for an {kind} worker (none has been online)" in html
    register(redis_url, "gpuhost:gpu0", {**H200_INFO, "kind": kind, "queue": f"gpu.{kind}"})
    assert 'id="waiting"' not in engineer_client.get(url).content.decode()
    redis_url.delete("autoweb:worker:gpuhost:gpu0")  # its heartbeat expired
    html = engineer_client.get(url).content.decode()
    assert f"waiting for an {kind} worker (none online since " in html


def test_the_idea_form_says_which_kinds_are_online_and_preselects_the_only_one(
    engineer_client, redis_url
):
    url = reverse("searches:idea_new")
    html = engineer_client.get(url).content.decode()
    assert "No worker is online now." in html
    assert "checked" not in html.split('name="target_kinds"')[1]
    register(redis_url, "cpu:0", {**H200_INFO, "kind": "interpret", "queue": "gpu.interpret"})
    html = engineer_client.get(url).content.decode()
    assert "Workers online now: interpret." in html
    box = re.search(r'<input[^>]*name="target_kinds"[^>]*value="interpret"[^>]*>', html).group(0)
    assert "checked" in box and 'data-online="interpret"' in box
    h200 = re.search(r'<input[^>]*name="target_kinds"[^>]*value="h200"[^>]*>', html).group(0)
    assert "checked" not in h200
    assert "js/idea_form.js" in html  # asks before submitting for an offline kind


def test_the_sweep_mirrors_live_workers_and_their_ceilings_reach_the_prompt(redis_url, search):
    """Real liveness is the worker's Redis heartbeat; the orchestrator's sweep copies it into
    the Worker table, so what the worker measured reaches the roofline and the agent."""
    from searches import orchestrator
    from searches.agent import context
    from searches.models import Worker

    register(redis_url, "gpuhost:gpu0", {**H200_INFO, "job": "autoweb-trial-7-a1"})
    assert orchestrator.mirror_workers(redis_url) == 1
    row = Worker.objects.get(name="gpuhost:gpu0")
    assert (row.kind, row.queue, row.device_name) == ("h200", "gpu.h200", "NVIDIA H200")
    assert row.current_job_id == "autoweb-trial-7-a1" and row.online
    assert row.versions["triton"] == "3.6.0"
    measured = context.measured_ceilings("h200")
    assert measured["copy_gbps"] == 4176.9 and measured["matmul_tflops_bf16"] == 793.7
    prompt_input = context.gather(search, "h200")
    assert prompt_input.ceilings["copy_gbps"] == 4176.9  # measured, not the datasheet's
    # A worker that stops beating is no longer mirrored as busy; its row ages out.
    redis_url.delete("autoweb:worker:gpuhost:gpu0")
    assert orchestrator.mirror_workers(redis_url) == 0


def test_the_gpus_page_lists_each_kinds_live_workers(engineer_client, redis_url):
    from searches import orchestrator

    register(redis_url, "gpuhost:gpu0", {**H200_INFO, "job": "autoweb-trial-7-a1"})
    register(redis_url, "gpuhost:gpu1", H200_INFO)
    orchestrator.mirror_workers(redis_url)  # the kind has a section once a worker registered
    html = engineer_client.get(reverse("searches:gpus")).content.decode()
    table = html[html.index('id="workers-h200"') :]
    table = table[: table.index("</table>")]
    assert "<code>gpuhost:gpu0</code>" in table and "<code>autoweb-trial-7-a1</code>" in table
    assert "<code>gpuhost:gpu1</code>" in table and "idle" in table
    assert " s ago" in table


def _idea_post(**extra):
    return {
        "title": "Softmax for the H200",
        "problem": "softmax",
        "target_kinds": ["h200"],
        "proposer": "tuner",
        "max_trials": "5",
        "max_gpu_minutes": "5",
        "max_wall_minutes": "5",
        **extra,
    }


def test_the_idea_form_asks_before_taking_an_idea_for_a_kind_with_no_worker_online(
    engineer_client, redis_url
):
    from searches.models import Idea

    url = reverse("searches:idea_new")
    response = engineer_client.post(url, _idea_post())
    html = response.content.decode()
    assert response.status_code == 400 and not Idea.objects.exists()
    assert "No h200 worker is online now: a search for it waits until one starts." in html
    assert 'value="Softmax for the H200"' in html  # nothing typed was lost
    assert 'name="start_anyway"' in html
    # The user says yes: the idea is taken.
    response = engineer_client.post(url, _idea_post(start_anyway="on"))
    assert response.status_code == 302 and Idea.objects.get().target_kinds == ["h200"]
    # With an h200 worker online there is nothing to ask.
    register(redis_url, "gpuhost:gpu0", H200_INFO)
    response = engineer_client.post(url, _idea_post(title="second"))
    assert response.status_code == 302 and Idea.objects.count() == 2


def test_with_redis_unreachable_the_idea_form_calls_no_kind_offline(engineer_client, dead_redis):
    from searches.models import Idea

    url = reverse("searches:idea_new")
    html = engineer_client.get(url).content.decode()
    assert "data-online" not in html  # the script asks nothing either
    response = engineer_client.post(url, _idea_post())
    assert response.status_code == 302 and Idea.objects.get().target_kinds == ["h200"]
