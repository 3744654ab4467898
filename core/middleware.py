"""Request checks that hold for every view."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


class RefuseNulMiddleware:
    """A NUL character in a query string or form field is refused with 400 before any view
    runs: no text a user types holds one, and PostgreSQL refuses it in a text column or a
    query parameter (a view would fail with a 500 there, and only there)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        fields = [request.GET]
        if request.method == "POST" and request.content_type in (
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ):
            fields.append(request.POST)
        for q in fields:
            for key, values in q.lists():
                if "\x00" in key or any("\x00" in v for v in values):
                    return HttpResponseBadRequest(
                        "A NUL character is not allowed in a request.",
                        content_type="text/plain; charset=utf-8",
                    )
        return self.get_response(request)
