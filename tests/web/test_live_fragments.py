"""The live socket's pure pieces: marking partials out-of-band, progress hints, messages, CSRF."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import AnonymousUser
from django.middleware.csrf import _does_token_match
from django.template import RequestContext, Template

from searches import consumers
from searches.consumers import Shown, View
from searches.models import Trial


def test_a_partial_root_is_marked_out_of_band_after_leading_comments():
    html = '<!-- row -->\n<tr id="trial-7" class="x"><td><tr-ish></td></tr>'
    assert consumers._oob(html, "tr") == (
        '<!-- row -->\n<tr hx-swap-oob="true" id="trial-7" class="x"><td><tr-ish></td></tr>'
    )


def test_a_partial_with_another_root_is_an_error_not_a_silent_miss():
    with pytest.raises(ValueError, match="<section>"):
        consumers._oob('<div id="search-status"></div>', "section")


@pytest.mark.parametrize(
    ("status", "event", "progress"),
    [
        (
            "verifying",
            {"phase": "verifying", "shape": 3, "of": 8},
            {"phase": "verifying", "shape": 3, "of": 8},
        ),
        ("compiling", {"phase": "compiling"}, {"phase": "compiling"}),
        # A late hint for a phase the row has left is not shown.
        ("benchmarking", {"phase": "verifying", "shape": 3, "of": 8}, None),
        ("verifying", {"phase": "verifying", "shape": "3", "of": 8}, {"phase": "verifying"}),
        ("verifying", {"phase": "verifying", "shape": 9, "of": 8}, {"phase": "verifying"}),
        ("kept", None, None),
        ("kept", "garbage", None),
    ],
)
def test_worker_progress_reaches_the_row_only_while_it_matches_the_database(
    status, event, progress
):
    assert consumers._progress(Trial(status=status), event) == progress


def test_a_naive_since_is_read_in_the_sites_time_zone():
    since, problem = consumers._parse_since(json.dumps({"since": "2026-03-01T12:30:00"}))
    assert problem is None
    assert since == datetime(2026, 3, 1, 12, 30, tzinfo=UTC)


def _view(cookies: dict[str, str]) -> View:
    return View(user=AnonymousUser(), search_id=1, shown=Shown(), cookies=cookies)


def test_pushed_forms_carry_a_csrf_token_for_the_browsers_cookie(settings):
    secret = "a" * 16 + "B" * 16
    request = _view({settings.CSRF_COOKIE_NAME: secret}).request()
    html = Template("{% csrf_token %}").render(RequestContext(request))
    token = html.split('value="')[1].split('"')[0]
    assert _does_token_match(token, secret)


@pytest.mark.parametrize("cookie", ["", "short", "x" * 31 + "!", "é" * 32])
def test_a_malformed_csrf_cookie_is_ignored(settings, cookie):
    request = _view({settings.CSRF_COOKIE_NAME: cookie}).request()
    assert "CSRF_COOKIE" not in request.META
    Template("{% csrf_token %}").render(RequestContext(request))  # renders; no error
