"""The releases page with many releases: pages of 50, filters kept across pages, a summary over
every page, a bounded number of queries, and revoke returning to the page it was sent from."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from library import selectors, services
from library.models import Release
from tests.library.helpers import bulk_releases

pytestmark = pytest.mark.django_db
URL = reverse("library:releases")


@pytest.fixture
def reviewer_client(reviewer):
    client = Client()
    client.force_login(reviewer)
    return client


def shown(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr class="release-row" data-release="(\d+)"', html)]


def get(client: Client, **query: object) -> str:
    response = client.get(URL, query)
    assert response.status_code == 200
    return response.content.decode()


def test_120_releases_are_three_pages_of_the_newest_first(engineer_client, search, reviewer):
    rels = bulk_releases(search, reviewer, 120)
    newest_first = [r.pk for r in reversed(rels)]
    html = get(engineer_client)
    assert shown(html) == newest_first[:50]
    assert "page 1 of 3 · 120 in all" in html
    assert shown(get(engineer_client, page=2)) == newest_first[50:100]
    assert shown(get(engineer_client, page=3)) == newest_first[100:]
    assert "r" * 20_000 not in html and "# release" not in html  # no report, no source


def test_the_pager_keeps_the_filters_on_every_link(engineer_client, search, reviewer):
    bulk_releases(search, reviewer, 120, kind="h100")
    bulk_releases(search, reviewer, 30, kind="b200")
    html = get(engineer_client, kind="h100", state="active", page=2)
    assert "page 2 of 3 · 120 in all" in html
    for page in (1, 3):
        assert f'href="?kind=h100&amp;state=active&amp;page={page}"' in html
    assert 'href="?page=' not in html
    assert '<option value="h100" selected>' in html
    assert '<option value="active" selected>' in html


def test_the_problem_kind_and_state_filters_select_rows(engineer_client, search, reviewer):
    soft = bulk_releases(search, reviewer, 3, kind="h100")
    other = bulk_releases(search, reviewer, 2, problem="rmsnorm", kind="h100")
    gone = bulk_releases(search, reviewer, 2, kind="b200")
    Release.objects.filter(pk=gone[0].pk).update(revoked_at=timezone.now(), revoked_by=reviewer)
    assert set(shown(get(engineer_client, problem="rmsnorm"))) == {r.pk for r in other}
    assert set(shown(get(engineer_client, problem="softmax", kind="h100"))) == {r.pk for r in soft}
    assert shown(get(engineer_client, state="revoked")) == [gone[0].pk]
    assert gone[0].pk not in shown(get(engineer_client, state="active"))
    assert len(shown(get(engineer_client, state="junk"))) == 7  # unknown state: both
    html = get(engineer_client, problem="no-such-problem")
    assert shown(html) == [] and "No release matches these filters." in html


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("junk", 1),
        ("", 1),
        ("0", 1),
        ("-3", 1),
        ("1e3", 1),
        ("2.5", 1),
        ("9" * 5000, 1),  # past Python's digit limit: not a number it will parse
        ("3", 3),
        ("4", 3),
        ("99999999999999999999", 3),
    ],
)
def test_a_page_number_that_is_not_one_or_past_the_end_is_clamped(
    engineer_client, search, reviewer, page, expected
):
    bulk_releases(search, reviewer, 101)
    html = get(engineer_client, page=page)
    assert f"page {expected} of 3 · 101 in all" in html
    assert len(shown(html)) == (1 if expected == 3 else 50)


def test_no_release_is_one_empty_page(engineer_client):
    html = get(engineer_client, page=7)
    assert shown(html) == [] and "No releases yet." in html and 'class="pager"' not in html


def _queries(client: Client, **query: object) -> int:
    with CaptureQueriesContext(connection) as ctx:
        get(client, **query)
    return len(ctx.captured_queries)


def test_the_number_of_queries_does_not_grow_with_the_releases(
    reviewer_client, search, reviewer, engineer
):
    def seed(n: int) -> None:
        for kind in ("h100", "h200"):
            rels = bulk_releases(search, reviewer, n // 2, kind=kind)
            # Revoked by someone else: the page shows who, from the same join.
            Release.objects.filter(pk__in=[r.pk for r in rels[::3]]).update(
                revoked_at=timezone.now(), revoked_by=engineer
            )

    seed(10)
    few = _queries(reviewer_client)
    few_filtered = _queries(reviewer_client, kind="h200", state="revoked", page=2)
    seed(90)  # 100 in all
    assert _queries(reviewer_client) == few
    assert _queries(reviewer_client, kind="h200", state="revoked", page=2) == few_filtered
    # 10 for the list and its summary, and 1 for the approvals awaiting re-validation above it.
    assert few <= 11


def test_a_page_loads_neither_sources_nor_measurements_nor_reports(search, reviewer):
    bulk_releases(search, reviewer, 60)
    page = selectors.releases_page(page=2)
    (group,) = page.groups
    row = group["releases"][0]
    assert {"source", "shapes"} <= row.get_deferred_fields()
    assert {"report", "source", "prompt"} <= row.trial.get_deferred_fields()


def test_the_summary_covers_every_page_and_only_active_releases(engineer_client, search, reviewer):
    # Release 1 is the fastest and the oldest: the last page. Release 2 is faster than all
    # but 1. A group whose only release is revoked has no best.
    rels = bulk_releases(search, reviewer, 120, speedup=lambda i: {1: 9.0, 2: 8.0}.get(i, 1.5))
    lone = bulk_releases(search, reviewer, 1, kind="b200", speedup=lambda i: 5.0)
    Release.objects.filter(pk=lone[0].pk).update(revoked_at=timezone.now())
    html = get(engineer_client)
    assert rels[0].pk not in shown(html)
    row = html[html.index('id="summary-softmax-h200"') :]
    row = row[: row.index("</tr>")]
    assert f"#{rels[0].pk}</a>" in row and "9.00×" in row
    assert ">120<" in row  # active and total
    none = html[html.index('id="summary-softmax-b200"') :]
    assert "none active" in none[: none.index("</tr>")]

    Release.objects.filter(pk=rels[0].pk).update(revoked_at=timezone.now())
    html = get(engineer_client, page=2)
    row = html[html.index('id="summary-softmax-h200"') :]
    row = row[: row.index("</tr>")]
    assert f"#{rels[1].pk}</a>" in row and "8.00×" in row and ">119<" in row


def test_the_best_release_is_the_newest_of_equals_and_any_release_without_a_speedup(
    search, reviewer, django_assert_max_num_queries
):
    tied = bulk_releases(search, reviewer, 40, speedup=lambda i: 2.0)
    untimed = bulk_releases(search, reviewer, 3, kind="b200", speedup=lambda i: None)
    with django_assert_max_num_queries(2):
        rows = selectors.released_speedups()
        labels = [row["label"] for row in rows]
    assert [(r["kind"], r["problem"], r["speedup_eager"]) for r in rows] == [
        ("b200", "softmax", None),
        ("h200", "softmax", 2.0),
    ]
    assert labels[0].startswith(f"release #{untimed[-1].pk} ")
    assert labels[1].startswith(f"release #{tied[-1].pk} ")


def test_released_speedups_take_two_queries_whatever_the_number(
    search, reviewer, django_assert_max_num_queries
):
    for kind in ("h100", "h200", "b200"):
        bulk_releases(search, reviewer, 100, kind=kind)
    with django_assert_max_num_queries(2):
        rows = selectors.released_speedups()
    assert [r["kind"] for r in rows] == ["b200", "h100", "h200"]
    assert {r["speedup_eager"] for r in rows} == {2.0}


def _csrf(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def _return_query(html: str) -> str:
    return re.search(r'name="return_query" value="([^"]*)"', html).group(1).replace("&amp;", "&")


def test_revoking_from_page_2_returns_to_page_2_with_its_filters(search, reviewer):
    rels = bulk_releases(search, reviewer, 120, kind="h100")
    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    html = client.get(URL, {"kind": "h100", "state": "active", "page": 2}).content.decode()
    target = shown(html)[0]
    assert target == rels[-51].pk
    form = {"csrfmiddlewaretoken": _csrf(html), "return_query": _return_query(html)}
    assert form["return_query"] == "kind=h100&state=active&page=2"
    revoke = reverse("library:revoke", args=[target])
    assert client.post(revoke, {"reason": "wrong on odd N"}).status_code == 403  # no token
    assert Release.objects.get(pk=target).active

    response = client.post(revoke, {**form, "reason": "wrong on odd N"})
    assert response.status_code == 302
    assert response["Location"] == f"{URL}?kind=h100&state=active&page=2"
    first = Release.objects.get(pk=target)
    assert not first.active and first.revoke_reason == "wrong on odd N"
    assert first.revoked_by == reviewer
    after = client.get(response["Location"]).content.decode()
    assert f"Release {target} revoked" in after
    assert target not in shown(after) and "119 in all" in after

    # The same form again (a double submit): nothing changes, and the page says so.
    again = client.post(revoke, {**form, "reason": "second thoughts"}, follow=True)
    assert again.redirect_chain == [(f"{URL}?kind=h100&state=active&page=2", 302)]
    assert f"Release {target} was already revoked." in again.content.decode()
    second = Release.objects.get(pk=target)
    assert (second.revoked_at, second.revoke_reason) == (first.revoked_at, "wrong on odd N")
    assert Release.objects.filter(revoked_at__isnull=False).count() == 1


@pytest.mark.parametrize(
    "return_query",
    [
        "https://evil.example/",
        "//evil.example/x",
        "page=2&next=https://evil.example/",
        "page=%0d%0aSet-Cookie:x=1",
        "",
    ],
)
def test_revoke_goes_back_only_to_the_releases_page(
    reviewer_client, search, reviewer, return_query
):
    (rel,) = bulk_releases(search, reviewer, 1)
    response = reviewer_client.post(
        reverse("library:revoke", args=[rel.pk]), {"reason": "x", "return_query": return_query}
    )
    assert response.status_code == 302
    location = response["Location"]
    assert location == URL or location.startswith(f"{URL}?")
    assert "evil" not in location and "\n" not in location and "next" not in location


def test_a_failed_revoke_also_returns_to_the_page(reviewer_client, search, reviewer):
    rels = bulk_releases(search, reviewer, 60)
    response = reviewer_client.post(
        reverse("library:revoke", args=[rels[0].pk]), {"reason": " ", "return_query": "page=2"}
    )
    assert response["Location"] == f"{URL}?page=2"
    assert Release.objects.get(pk=rels[0].pk).active
    html = reviewer_client.get(response["Location"]).content.decode()
    assert "Say why the release is revoked." in html


def test_the_service_still_revokes_once(search, reviewer):
    (rel,) = bulk_releases(search, reviewer, 1)
    services.revoke_release(release=rel, user=reviewer, reason="first")
    services.revoke_release(release=rel, user=reviewer, reason="second")
    rel.refresh_from_db()
    assert rel.revoke_reason == "first"
