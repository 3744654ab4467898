from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser, Group
from django.urls import reverse
from django.utils import timezone

from core.errors import DomainError, UnknownWorker
from core.roles import ENGINEERS, REVIEWERS, is_engineer, is_reviewer
from searches import selectors, services
from searches.models import Worker
from tests.web.domain import accepted, judge, propose

pytestmark = pytest.mark.django_db


def _register(name: str = "host-a:gpu0", kind: str = "h200", **extra) -> Worker:
    kwargs = {
        "name": name,
        "kind": kind,
        "device_name": "NVIDIA H200",
        "ceilings": {"copy_gbps": 4270.0, "bf16_tflops": 688.0},
        "versions": {"torch": "2.11.0", "triton": "3.6.0"},
        "queue": f"gpu.{kind}",
    }
    kwargs.update(extra)
    return services.upsert_worker(**kwargs)


# -- workers ----------------------------------------------------------------------------------


def test_a_worker_registers_once_and_updates_in_place():
    _register()
    _register(device_name="NVIDIA H200 NVL", ceilings={"copy_gbps": 4300.0})
    worker = Worker.objects.get()
    assert (worker.name, worker.kind, worker.queue) == ("host-a:gpu0", "h200", "gpu.h200")
    assert worker.device_name == "NVIDIA H200 NVL"
    assert worker.ceilings == {"copy_gbps": 4300.0}
    assert worker.versions == {"torch": "2.11.0", "triton": "3.6.0"}
    assert worker.online and worker.to_dict()["online"] is True


def test_an_interpret_worker_has_no_ceilings():
    worker = _register("laptop:cpu", kind="interpret", ceilings=None, device_name="")
    assert Worker.objects.get().ceilings is None and worker.queue == "gpu.interpret"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": " "}, "name"),
        ({"kind": "H200"}, "kind"),
        ({"queue": "gpu.a100"}, "queue"),
        ({"queue": "search"}, "queue"),
        ({"ceilings": [1, 2]}, "ceilings"),
        ({"versions": "2.11"}, "versions"),
    ],
)
def test_a_bad_registration_is_refused(overrides, field):
    with pytest.raises(DomainError) as caught:
        _register(**overrides)
    assert field in caught.value.message_dict
    assert Worker.objects.count() == 0


def test_a_worker_is_online_only_while_its_heartbeat_is_fresh(settings):
    settings.AUTOWEB_WORKER_ONLINE_S = 30
    now = timezone.now()
    _register("fresh:gpu0", now=now - timedelta(seconds=40))
    _register("stale:gpu0", now=now - timedelta(seconds=40))
    services.heartbeat(name="fresh:gpu0", now=now - timedelta(seconds=29))
    assert [w.name for w in selectors.workers_online(now=now)] == ["fresh:gpu0"]
    stale = Worker.objects.get(name="stale:gpu0")
    assert not stale.is_online(now) and Worker.objects.get(name="fresh:gpu0").is_online(now)
    assert not stale.online
    assert [w.name for w in selectors.all_workers()] == ["fresh:gpu0", "stale:gpu0"]
    assert selectors.workers_online(now=now + timedelta(seconds=2)) == []


def test_the_online_window_is_a_setting(settings):
    now = timezone.now()
    _register(now=now - timedelta(seconds=100))
    settings.AUTOWEB_WORKER_ONLINE_S = 120
    assert Worker.objects.get().is_online(now)
    assert len(selectors.workers_online(now=now)) == 1


def test_a_heartbeat_records_the_current_job_only_when_given():
    _register()
    services.heartbeat(name="host-a:gpu0", current_job_id="job-7")
    services.heartbeat(name="host-a:gpu0")
    assert Worker.objects.get().current_job_id == "job-7"
    services.heartbeat(name="host-a:gpu0", current_job_id=None)
    assert Worker.objects.get().current_job_id is None


def test_a_heartbeat_from_an_unregistered_worker_is_refused():
    with pytest.raises(UnknownWorker, match="No worker named 'ghost:gpu0' has registered"):
        services.heartbeat(name="ghost:gpu0")
    assert Worker.objects.count() == 0


# -- roles ------------------------------------------------------------------------------------


def test_the_role_groups_exist_after_migrating():
    assert set(Group.objects.values_list("name", flat=True)) >= {ENGINEERS, REVIEWERS}


def test_roles_by_group(django_user_model, engineer, reviewer, outsider):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-42-long!")
    assert (is_engineer(engineer), is_reviewer(engineer)) == (True, False)
    assert (is_engineer(reviewer), is_reviewer(reviewer)) == (True, True)
    assert (is_engineer(root), is_reviewer(root)) == (True, True)
    assert (is_engineer(outsider), is_reviewer(outsider)) == (False, False)
    assert (is_engineer(AnonymousUser()), is_reviewer(AnonymousUser())) == (False, False)
    assert (is_engineer(None), is_reviewer(None)) == (False, False)


def test_a_deactivated_user_holds_no_role(engineer):
    engineer.is_active = False
    assert not is_engineer(engineer)


def test_granting_a_role(outsider):
    assert not is_engineer(outsider)
    services.grant_role(user=outsider, role=REVIEWERS)
    assert is_reviewer(outsider) and is_engineer(outsider)
    assert list(outsider.groups.values_list("name", flat=True)) == [REVIEWERS]
    with pytest.raises(DomainError, match="Unknown role 'admins'"):
        services.grant_role(user=outsider, role="admins")


# -- admin ------------------------------------------------------------------------------------


def test_the_admin_lists_and_shows_every_model(client, django_user_model, search):
    trial = judge(propose(search, 1), accepted())
    worker = _register()
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-42-long!")
    client.force_login(root)
    for model, obj in [
        ("idea", search.idea),
        ("search", search),
        ("trial", trial),
        ("worker", worker),
    ]:
        listing = client.get(reverse(f"admin:searches_{model}_changelist"))
        assert listing.status_code == 200, model
        page = client.get(reverse(f"admin:searches_{model}_change", args=[obj.pk]))
        assert page.status_code == 200, model
    html = client.get(reverse("admin:searches_trial_change", args=[trial.pk])).content.decode()
    assert "&quot;verdict&quot;: &quot;accepted&quot;" in html  # the report, indented and escaped
    assert client.get(reverse("admin:searches_trial_add")).status_code == 403
