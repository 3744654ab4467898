"""Websocket routes (the http side is autoweb/urls.py)."""

from __future__ import annotations

from django.urls import path

from searches.consumers import SearchConsumer

websocket_urlpatterns = [
    path("ws/searches/<int:search_id>/", SearchConsumer.as_asgi()),
]
